"""GPUs with their nearest host NUMA node, read without initialising CUDA where the driver
allows: NVML first (``nvml.py``), else the driver's files (``procfs.py``); the CUDA driver
(``cuda_devices.py``) only when asked, or when only CUDA can say which GPUs it shows
(``visible.py``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from ..sysfs import Sysfs

GpuSource = Literal["auto", "nvml", "files", "cuda"]
NO_DRIVER = "no CUDA driver (libcuda.so.1 not found)"


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as CUDA shows it. ``index`` orders GPUs by PCI bus id (target name
    gpu<index>). A fact its source cannot give is None (see ``source``)."""

    index: int
    ordinal: int | None  # CUDA's device ordinal; None where only CUDA could say
    name: str
    uuid: str
    pci_bus_id: str  # 'dddd:bb:dd.f', lower case
    total_memory: int | None  # bytes, as cuDeviceTotalMem counts them
    sm_count: int | None
    compute_capability: tuple[int, int] | None
    numa_node: int | None  # nearest host node
    numa_node_source: str  # 'driver', 'sysfs', 'only-cpu-node' or 'none' (see nearest.py)
    source: str  # where the facts came from: 'nvml', 'procfs' or 'cuda'
    sm_count_source: str | None = None  # 'cuda', or 'nvml-cores' (cores / FP32 lanes per SM)
    # only the CUDA driver knows these: None unless it was asked (source 'cuda')
    can_map_host_memory: bool | None = None
    unified_addressing: bool | None = None
    pageable_memory_access: bool | None = None  # also NVML's addressing mode (HMM or ATS)
    host_register_supported: bool | None = None
    async_engines: int | None = None
    l2_cache: int | None = None  # bytes

    @property
    def target_name(self) -> str:
        """The GPU's tier name: gpu0, gpu1... in PCI bus order."""
        return f"gpu{self.index}"

    @property
    def cc_text(self) -> str | None:
        """The compute capability as CUDA writes it ('9.0'); None when unknown."""
        cc = self.compute_capability
        return None if cc is None else f"{cc[0]}.{cc[1]}"


@dataclass(frozen=True)
class GpuInventory:
    """The GPUs, or why there are none (``absent_reason``)."""

    devices: tuple[GpuDevice, ...]
    # the CUDA version the driver supports (13000: 13.0); None where neither NVML nor
    # the CUDA driver was asked (the driver's files do not say it)
    driver_version: int | None
    absent_reason: str | None


def read_gpus(sysfs: Sysfs | None = None, *, via: GpuSource = "auto") -> GpuInventory:
    """The GPUs CUDA shows this process. No driver or no GPU is reported, not raised.

    ``via``: 'auto' reads NVML, else the driver's files, and starts CUDA only where they
    cannot tell which GPUs CUDA shows or no NVIDIA driver file is there to read; 'nvml'
    the same, never starting CUDA; 'files' the driver's files alone (no library loaded);
    'cuda' every fact from the CUDA driver (about a quarter of a second to start). A
    recorded tree (a sysroot other than /) is read from its files alone."""
    fs = sysfs or Sysfs()
    if fs.root != "/":
        via, environ = "files", {}  # another machine's files: this process's CUDA_* do not apply
    else:
        environ = dict(os.environ)
    if via == "cuda":
        return _from_cuda(fs)
    from . import procfs
    from .visible import Undecided

    why = "no NVIDIA GPU driver"
    try:
        if via != "files":
            from . import nvml

            try:
                return nvml.read_inventory(fs, environ)
            except nvml.NvmlUnusable as e:
                why += f" ({e})"
        found = procfs.read_inventory(fs, environ)
        if found is not None:
            return found
    except Undecided as e:
        why = f"only CUDA can say which GPUs it shows: {e}"
    if via != "auto":
        return GpuInventory((), None, why)
    return _from_cuda(fs)


def _from_cuda(fs: Sysfs) -> GpuInventory:
    from ..errors import LibraryNotFoundError
    from . import cuda_devices

    try:
        return cuda_devices.read_inventory(fs)
    except LibraryNotFoundError:
        return GpuInventory((), None, NO_DRIVER)


def with_cuda_facts(g: GpuDevice) -> GpuDevice:
    """``g`` as the CUDA driver reports it, with what only CUDA knows (its ordinal, SM
    count, L2 cache, host-memory flags). Initialises CUDA: for code that needs a context."""
    if g.source == "cuda":
        return g
    from . import cuda_devices

    return cuda_devices.by_bus_id(g.pci_bus_id, g.index)


def normalize_bus_id(bus_id: str) -> str:
    """'00000000:19:00.0' or '0000:19:00.0' -> '0000:19:00.0' (sysfs form)."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)
