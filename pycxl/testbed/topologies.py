"""Emulated CXL topologies for QEMU's q35 machine (type-3 volatile devices).

Serial numbers are fixed per device (QEMU ``sn=``): memdev numbers follow the kernel's
asynchronous probe order and are not stable across boots, serials are.
"""

from __future__ import annotations

from dataclasses import dataclass

DEVICE_SIZE = 256 << 20
WINDOW_SIZE = 4 << 30


@dataclass(frozen=True)
class HostBridge:
    id: str  # QEMU id, e.g. 'cxl.1'
    bus_nr: int  # becomes the ACPI _UID, i.e. the root decoder's target id
    serials: tuple[int, ...]  # one type-3 device behind each root port


@dataclass(frozen=True)
class Window:
    """A CXL fixed memory window (CFMWS): one root decoder in the guest."""

    targets: tuple[str, ...]  # host bridge ids, in interleave order
    size: int = WINDOW_SIZE
    granularity: str = "4k"


@dataclass(frozen=True)
class Topology:
    name: str
    description: str
    bridges: tuple[HostBridge, ...]
    windows: tuple[Window, ...]

    def device_id(self, serial: int) -> str:
        """QEMU's id of the type-3 device with this serial number (for QMP)."""
        return f"cxl-vmem{serial}"

    @property
    def serials(self) -> tuple[int, ...]:
        """The memdev serial numbers, bridge by bridge."""
        return tuple(s for b in self.bridges for s in b.serials)

    def qemu_args(self) -> list[str]:
        """QEMU's arguments for this topology."""
        args = ["-cpu", "max,hypervisor=off", "-M", "q35,cxl=on"]
        slot = 2
        for b in self.bridges:
            args += ["-device", f"pxb-cxl,bus_nr={b.bus_nr},bus=pcie.0,id={b.id}"]
            for port, sn in enumerate(b.serials):
                rp = f"rp{b.bus_nr}_{port}"
                args += [
                    "-object",
                    f"memory-backend-ram,id=vmem{sn},share=on,size={DEVICE_SIZE}",
                    "-device",
                    f"cxl-rp,port={port},bus={b.id},id={rp},chassis=0,slot={slot}",
                    "-device",
                    f"cxl-type3,bus={rp},volatile-memdev=vmem{sn},id={self.device_id(sn)},sn={sn:#x}",
                ]
                slot += 1
        fmw = []
        for i, w in enumerate(self.windows):
            fmw += [f"cxl-fmw.{i}.targets.{j}={t}" for j, t in enumerate(w.targets)]
            fmw += [f"cxl-fmw.{i}.size={w.size >> 30}G"]
            fmw += [f"cxl-fmw.{i}.interleave-granularity={w.granularity}"]
        args += ["-M", ",".join(fmw)]
        return args


TOPOLOGIES: dict[str, Topology] = {
    t.name: t
    for t in (
        Topology(
            name="two-dev",
            description="one host bridge, two root ports, two 256 MiB volatile devices, "
            "one 4 GiB window",
            bridges=(HostBridge("cxl.1", 12, (0x1, 0x2)),),
            windows=(Window(("cxl.1",)),),
        ),
        Topology(
            name="four-dev",
            description="two host bridges with two 256 MiB volatile devices each; window 0 "
            "interleaves both bridges, window 1 targets the first bridge only",
            bridges=(
                HostBridge("cxl.1", 12, (0x11, 0x12)),
                HostBridge("cxl.2", 222, (0x21, 0x22)),
            ),
            windows=(Window(("cxl.1", "cxl.2")), Window(("cxl.1",))),
        ),
    )
}
DEFAULT_TOPOLOGY = "two-dev"
