"""Emulated CXL topologies for QEMU's q35 machine (type-3 devices: volatile capacity,
and where a topology says so, persistent capacity with a label storage area).

Serial numbers are fixed per device (QEMU ``sn=``): memdev numbers follow the kernel's
asynchronous probe order and are not stable across boots, serials are.

A topology also says how the guest's CPUs and DRAM split into sockets (NUMA nodes with
CPUs, made by virtme-ng's ``--numa``), which socket each CXL host bridge belongs to, and
what the firmware advertises (ACPI HMAT): each socket's DRAM seen from each socket, and
each host bridge (an ACPI generic port) seen from each socket, from which the kernel
derives a CXL region's figures with the devices' own CDAT.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base.sysfs import parse_cpulist
from ..base.units import parse_size

DEVICE_SIZE = 256 << 20
WINDOW_SIZE = 4 << 30


@dataclass(frozen=True)
class HostBridge:
    id: str  # QEMU id, e.g. 'cxl.1'
    bus_nr: int  # becomes the ACPI _UID, i.e. the root decoder's target id
    serials: tuple[int, ...]  # one type-3 device behind each root port
    socket: int | None = None  # the socket (NUMA node) it belongs to, where one is said


@dataclass(frozen=True)
class Socket:
    """A NUMA node with CPUs and DRAM."""

    cpus: str  # CPU list, '0-1'
    memory: str  # QEMU size, '2G'


@dataclass(frozen=True)
class Figure:
    """What the firmware advertises for one access: latency and bandwidth (HMAT)."""

    latency_ns: int
    bandwidth: str  # QEMU size per second: '200G' (GiB/s)


@dataclass(frozen=True)
class Hmat:
    """HMAT for every socket: its own DRAM and another socket's, and a host bridge of its
    own socket and of another (generic ports: CPU to the bridge; the kernel adds the
    devices' CDAT figures)."""

    dram_local: Figure
    dram_remote: Figure
    port_local: Figure
    port_remote: Figure


@dataclass(frozen=True)
class PcieDevice:
    """A plain PCIe device on a socket's own PCIe root: where a GPU would sit."""

    bus_nr: int
    socket: int


@dataclass(frozen=True)
class Window:
    """A CXL fixed memory window (CFMWS): one root decoder in the guest."""

    targets: tuple[str, ...]  # host bridge ids, in interleave order
    size: int = WINDOW_SIZE
    granularity: str = "4k"


# SLIT distances of the generic-port proximity domains (QEMU wants every pair); the
# kernel makes no NUMA node of them
PORT_DISTANCE_LOCAL, PORT_DISTANCE_REMOTE, PORT_DISTANCE_PORTS = 14, 24, 28
SOCKET_DISTANCE = 21


@dataclass(frozen=True)
class Topology:
    name: str
    description: str
    bridges: tuple[HostBridge, ...]
    windows: tuple[Window, ...]
    sockets: tuple[Socket, ...] = (Socket("0-1", "2G"),)
    hmat: Hmat | None = None
    pcie: tuple[PcieDevice, ...] = ()
    # each device's persistent capacity and label storage area (0: volatile only)
    persistent_size: int = 0
    label_size: int = 0

    def device_id(self, serial: int) -> str:
        """QEMU's id of the type-3 device with this serial number (for QMP)."""
        return f"cxl-vmem{serial}"

    @property
    def serials(self) -> tuple[int, ...]:
        """The memdev serial numbers, bridge by bridge."""
        return tuple(s for b in self.bridges for s in b.serials)

    def _ports(self) -> list[tuple[int, HostBridge]]:
        """(proximity domain, bridge) of each host bridge that is a generic port."""
        if self.hmat is None:
            return []
        placed = [b for b in self.bridges if b.socket is not None]
        return [(len(self.sockets) + i, b) for i, b in enumerate(placed)]

    def vng_args(self) -> list[str]:
        """virtme-ng's memory, CPU and NUMA arguments: one node per socket (and an empty
        one per generic port, for HMAT to name)."""
        memory = sum(parse_size(s.memory) for s in self.sockets)
        cpus = sum(len(parse_cpulist(s.cpus)) for s in self.sockets)
        args = ["-m", f"{memory >> 20}M", "-p", str(cpus)]
        many = len(self.sockets) > 1 or self.hmat is not None
        for i, s in enumerate(self.sockets):
            args += ["--numa", f"{s.memory},cpus={s.cpus}" + (f",nodeid={i}" if many else "")]
        ports = self._ports()
        for node, _ in ports:
            args += ["--numa", f"0,nodeid={node}"]
        dist = {}
        for i in range(len(self.sockets)):
            for j in range(i + 1, len(self.sockets)):
                dist[i, j] = SOCKET_DISTANCE
            for node, b in ports:
                dist[i, node] = PORT_DISTANCE_LOCAL if b.socket == i else PORT_DISTANCE_REMOTE
        for a, (node_a, _) in enumerate(ports):
            for node_b, _ in ports[a + 1 :]:
                dist[node_a, node_b] = PORT_DISTANCE_PORTS
        for (src, dst), d in sorted(dist.items()):
            args += ["--numa-distance", f"{src},{dst}={d}"]
        return args

    def qemu_args(self) -> list[str]:
        """QEMU's arguments for this topology."""
        machine = "q35,cxl=on" + (",hmat=on" if self.hmat else "")
        args = ["-cpu", "max,hypervisor=off", "-M", machine]
        slot = 2
        for b in self.bridges:
            node = f",numa_node={b.socket}" if b.socket is not None else ""
            args += ["-device", f"pxb-cxl,bus_nr={b.bus_nr},bus=pcie.0,id={b.id}{node}"]
            for port, sn in enumerate(b.serials):
                rp = f"rp{b.bus_nr}_{port}"
                args += [
                    "-object",
                    f"memory-backend-ram,id=vmem{sn},share=on,size={DEVICE_SIZE}",
                    "-device",
                    f"cxl-rp,port={port},bus={b.id},id={rp},chassis=0,slot={slot}",
                    *self._persistent_backends(sn),
                    "-device",
                    f"cxl-type3,bus={rp},volatile-memdev=vmem{sn}{self._persistent_args(sn)},"
                    f"id={self.device_id(sn)},sn={sn:#x}",
                ]
                slot += 1
        for i, d in enumerate(self.pcie):
            bus = f"pcie.{100 + i}"
            args += [
                "-device", f"pxb-pcie,bus_nr={d.bus_nr},bus=pcie.0,id={bus},numa_node={d.socket}",
                "-device", f"pcie-root-port,bus={bus},id=prp{d.bus_nr},chassis={1 + i},slot={slot}",
                "-device", f"pci-testdev,bus=prp{d.bus_nr}",
            ]  # fmt: skip
            slot += 1
        fmw = []
        for i, w in enumerate(self.windows):
            fmw += [f"cxl-fmw.{i}.targets.{j}={t}" for j, t in enumerate(w.targets)]
            fmw += [f"cxl-fmw.{i}.size={w.size >> 30}G"]
            fmw += [f"cxl-fmw.{i}.interleave-granularity={w.granularity}"]
        args += ["-M", ",".join(fmw)]
        return args + self._hmat_args()

    def _persistent_backends(self, sn: int) -> list[str]:
        """The memory behind a device's persistent capacity and its label area."""
        out = []
        if self.persistent_size:
            out += [
                "-object",
                f"memory-backend-ram,id=pmem{sn},share=on,size={self.persistent_size}",
            ]
        if self.label_size:
            out += ["-object", f"memory-backend-ram,id=lsa{sn},share=on,size={self.label_size}"]
        return out

    def _persistent_args(self, sn: int) -> str:
        pmem = f",persistent-memdev=pmem{sn}" if self.persistent_size else ""
        return pmem + (f",lsa=lsa{sn}" if self.label_size else "")

    def _hmat_args(self) -> list[str]:
        if self.hmat is None:
            return []
        h = self.hmat
        ports = self._ports()
        args = []
        for n, b in ports:
            args += ["-object", f"acpi-generic-port,id=gp{n},pci-bus={b.id},node={n}"]
        for i in range(len(self.sockets)):
            targets = [(j, h.dram_local if i == j else h.dram_remote)
                       for j in range(len(self.sockets))]  # fmt: skip
            targets += [(n, h.port_local if b.socket == i else h.port_remote) for n, b in ports]
            for j, f in targets:
                lb = f"hmat-lb,initiator={i},target={j},hierarchy=memory,data-type=access"
                args += ["-numa", f"{lb}-latency,latency={f.latency_ns}",
                         "-numa", f"{lb}-bandwidth,bandwidth={f.bandwidth}"]  # fmt: skip
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
        Topology(
            name="two-socket",
            description="two sockets (CPU 0 and 1GiB DRAM; CPU 1 and 1 GiB) with HMAT; a "
            "host bridge with two 256 MiB volatile devices on each socket; window 0 on "
            "socket 0's bridge, window 1 on socket 1's, window 2 interleaving both; a "
            "PCIe device on socket 1",
            bridges=(
                HostBridge("cxl.1", 12, (0x11, 0x12), socket=0),
                HostBridge("cxl.2", 222, (0x21, 0x22), socket=1),
            ),
            windows=(Window(("cxl.1",)), Window(("cxl.2",)), Window(("cxl.1", "cxl.2"))),
            sockets=(Socket("0", "1G"), Socket("1", "1G")),
            hmat=Hmat(
                dram_local=Figure(100, "200G"),
                dram_remote=Figure(180, "100G"),
                port_local=Figure(60, "64G"),
                port_remote=Figure(160, "32G"),
            ),
            pcie=(PcieDevice(100, socket=1),),
        ),
        Topology(
            name="pmem-dev",
            description="one host bridge, two root ports, two devices with 256 MiB volatile "
            "and 256 MiB persistent capacity and a 1 MiB label area each, one 4 GiB window",
            bridges=(HostBridge("cxl.1", 12, (0x51, 0x52)),),
            windows=(Window(("cxl.1",)),),
            persistent_size=DEVICE_SIZE,
            label_size=1 << 20,
        ),
    )
}
DEFAULT_TOPOLOGY = "two-dev"
