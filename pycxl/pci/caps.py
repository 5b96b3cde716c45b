"""What a PCI device's configuration space says of CXL, as ``lspci -vv`` prints it: the
PCIe DVSEC for CXL Devices (CXL 2.0 8.1.3: Designated Vendor-Specific extended
capability of vendor 0x1E98, DVSEC ID 0), its capability and control registers. Root
reads the whole configuration space; anyone else gets its first 64 bytes, which hold
no extended capability."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from ..base.sysfs import Sysfs
from .devices import PCI_DEVICES

EXT_START = 0x100  # extended capabilities start here (PCIe)
EXT_DVSEC = 0x0023
CXL_VENDOR = 0x1E98
CXL_DEVICE_DVSEC = 0x0000  # PCIe DVSEC for CXL Devices
# offsets in that DVSEC and bits of its capability (0x0A) and control (0x0C) registers
CAP, CTRL = 0x0A, 0x0C
CACHE, IO, MEM, MEM_HWINIT = 0x1, 0x2, 0x4, 0x8
HDM_COUNT_SHIFT, HDM_COUNT_MASK = 4, 0x3
VIRAL = 0x4000


@dataclass(frozen=True)
class CxlCapability:
    """A device's CXL DVSEC: what it can do (CXLCap) and what is enabled (CXLCtl)."""

    revision: int  # the DVSEC's revision (1: CXL 2.0; 2 and up: CXL 3.x)
    cache: bool
    io: bool
    mem: bool
    mem_hw_init: bool
    hdm_count: int
    viral: bool
    cache_enabled: bool
    io_enabled: bool
    mem_enabled: bool

    def lspci_text(self) -> str:
        """CXLCap as lspci -vv writes it (pciutils 3.9): 'Cache- IO+ Mem+ Mem HW Init+
        HDMCount 1 Viral-'."""
        flag = {True: "+", False: "-"}
        return (f"Cache{flag[self.cache]} IO{flag[self.io]} Mem{flag[self.mem]} "
                f"Mem HW Init{flag[self.mem_hw_init]} HDMCount {self.hdm_count} "
                f"Viral{flag[self.viral]}")  # fmt: skip


@dataclass(frozen=True)
class Unread:
    """Why a device's CXL capability was not read."""

    reason: str


def read_cxl_capability(device: str, fs: Sysfs) -> CxlCapability | Unread | None:
    """PCI device ``device``'s CXL DVSEC; None where it has none; Unread where this user
    cannot see it (the extended configuration space is root's)."""
    data = fs.read_bytes(f"{PCI_DEVICES}/{device}/config")
    if data is None:
        return Unread("the recorded tree has no config file for it")
    if len(data) <= EXT_START:
        if fs.root == "/" and os.geteuid() != 0:
            return Unread("needs root (the extended configuration space is root's)")
        return None  # conventional PCI: no extended capabilities
    return parse_cxl_capability(data)


def parse_cxl_capability(config: bytes) -> CxlCapability | None:
    """The CXL device DVSEC in a configuration space dump, or None."""
    at, seen = EXT_START, set()
    while EXT_START <= at <= len(config) - 4 and at not in seen:
        seen.add(at)
        (header,) = struct.unpack_from("<I", config, at)
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == EXT_DVSEC and at + 0x10 <= len(config):
            (h1,) = struct.unpack_from("<I", config, at + 4)
            (dvsec_id,) = struct.unpack_from("<H", config, at + 8)
            if h1 & 0xFFFF == CXL_VENDOR and dvsec_id == CXL_DEVICE_DVSEC:
                return _device_dvsec(config, at, (h1 >> 16) & 0xF)
        at = header >> 20
    return None


def _device_dvsec(config: bytes, at: int, revision: int) -> CxlCapability:
    cap, ctrl = struct.unpack_from("<HH", config, at + CAP)
    return CxlCapability(
        revision=revision,
        cache=bool(cap & CACHE),
        io=bool(cap & IO),
        mem=bool(cap & MEM),
        mem_hw_init=bool(cap & MEM_HWINIT),
        hdm_count=(cap >> HDM_COUNT_SHIFT) & HDM_COUNT_MASK,
        viral=bool(cap & VIRAL),
        cache_enabled=bool(ctrl & CACHE),
        io_enabled=bool(ctrl & IO),
        mem_enabled=bool(ctrl & MEM),
    )
