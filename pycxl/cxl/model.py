"""The CXL object model: frozen dataclasses built by a backend (sysfs or libcxl).

Objects refer to each other by name; the ``CxlTopology`` that holds them answers the
navigation questions both ways (a memdev's endpoint, a port's decoders, a region's
memdevs, the regions a memdev is in...). Each object keeps a reference to its topology
(excluded from comparison and repr), so ``memdev.endpoint`` and ``port.decoders`` work
on the object itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ..base.values import PMEM, RAM, PartitionMode
from ..numa.access import AccessFigures

if TYPE_CHECKING:
    from .topology import CxlTopology

PortKind = Literal["root", "switch", "endpoint"]
DecoderKind = Literal["root", "switch", "endpoint"]


@dataclass(frozen=True)
class _Linked:
    topology: CxlTopology | None = field(default=None, compare=False, repr=False, kw_only=True)

    def _topo(self) -> CxlTopology:
        if self.topology is None:
            raise RuntimeError(f"{self!r} is not attached to a topology")
        return self.topology


@dataclass(frozen=True)
class Dport:
    """A downstream port of a CXL port: where a decoder target points."""

    name: str  # device name: 'pci0000:0c' for a host bridge, '0000:0c:00.0' for a root port
    id: int  # the id that decoders' target_list uses
    alias: str | None = None  # firmware/physical node, e.g. 'ACPI0016:00'
    # protocol errors can be injected here (the platform's EINJ, through debugfs); None
    # where debugfs or EINJ is absent. Not compared: libcxl 76.1 cannot say it
    protocol_injectable: bool | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Port(_Linked):
    """A CXL port: the root (platform), a switch or host bridge, or an endpoint."""

    name: str
    kind: PortKind
    host: str  # the device the port represents: ACPI0017:00, pci0000:0c, mem0...
    depth: int
    parent: str | None
    dports: tuple[Dport, ...] = ()
    enabled: bool = True
    parent_dport: str | None = None  # the parent port's dport this port hangs off
    # How many of its decoders are committed (the kernel commits and resets them in id
    # order, so these are decoders 0..n-1); None where the kernel does not say.
    decoders_committed: int | None = None

    @property
    def route(self) -> list[tuple[Port, str]]:
        """(port, dport name) from the root down to this port: the path decode follows."""
        hops: list[tuple[Port, str]] = []
        port: Port | None = self
        while port is not None and port.parent is not None and port.parent_dport:
            parent = port.parent_port
            if parent is None:
                break
            hops.append((parent, port.parent_dport))
            port = parent
        return hops[::-1]

    @property
    def decoders(self) -> list[Decoder]:
        """The port's HDM decoders."""
        return [d for d in self._topo().decoders if d.port == self.name]

    @property
    def parent_port(self) -> Port | None:
        """The port above this one (None for a root)."""
        return self._topo().port(self.parent) if self.parent else None

    @property
    def children(self) -> list[Port]:
        """The ports directly below this one."""
        return [p for p in self._topo().all_ports if p.parent == self.name]

    @property
    def memdev(self) -> Memdev | None:
        """For an endpoint port: the memdev it represents."""
        if self.kind != "endpoint":
            return None
        return self._topo().memdev_or_none(self.host)

    def dport_by_id(self, dport_id: int) -> Dport | None:
        """The downstream port with this target id, if any."""
        return next((d for d in self.dports if d.id == dport_id), None)


@dataclass(frozen=True)
class Decoder(_Linked):
    """An HDM decoder at any level; fields that do not apply to a level are None."""

    name: str
    kind: DecoderKind
    port: str
    resource: int | None  # HPA start
    size: int
    interleave_ways: int
    interleave_granularity: int | None
    locked: bool = False
    target_type: str | None = None  # 'expander' / 'accelerator' (switch, endpoint)
    target_list: tuple[int, ...] = ()  # dport ids in position order (root, switch)
    # root decoder capabilities
    pmem_capable: bool = False
    volatile_capable: bool = False
    accelmem_capable: bool = False
    type3_capable: bool = False
    qos_class: int | None = None
    # endpoint decoder fields
    mode: str | None = None  # 'none', 'ram', 'pmem', 'mixed'
    dpa_resource: int | None = None
    dpa_size: int | None = None
    region: str | None = None  # region this decoder is assigned to

    @property
    def enabled(self) -> bool:
        """ndctl's notion: a decoder of size 0 is 'disabled'."""
        return self.size != 0

    @property
    def id(self) -> int:
        """The decoder's index on its port (decoderX.Y -> Y)."""
        return int(self.name.rsplit(".", 1)[1])

    @property
    def committed(self) -> bool:
        """Decoding now. A switch or endpoint decoder that was reset keeps its last
        range and interleave in sysfs (the kernel does not clear them), so its port's
        commit count is the truth where the kernel gives one."""
        if self.kind == "root":
            return self.size != 0
        count = self.port_obj.decoders_committed
        return self.id < count if count is not None else self.size != 0

    @property
    def port_obj(self) -> Port:
        """The port this decoder belongs to."""
        return self._topo().port(self.port)

    @property
    def targets(self) -> list[Dport]:
        """The dports this decoder routes to, in interleave-position order."""
        port = self.port_obj
        return [d for i in self.target_list if (d := port.dport_by_id(i)) is not None]

    @property
    def memdev(self) -> Memdev | None:
        """For an endpoint decoder: the memdev it maps."""
        return self.port_obj.memdev if self.kind == "endpoint" else None

    @property
    def regions(self) -> list[Region]:
        """For a root decoder: the regions carved from its window."""
        return [r for r in self._topo().regions if r.decoder == self.name]

    def can_map(self, mode: PartitionMode) -> bool:
        """Whether this root decoder can map memory of ``mode``."""
        return {RAM: self.volatile_capable, PMEM: self.pmem_capable}[mode]

    @property
    def max_available_extent(self) -> int | None:
        """For a root decoder: the largest free contiguous span left in its window."""
        if self.kind != "root" or self.resource is None:
            return None
        used = sorted(
            (r.resource, r.resource + r.size)
            for r in self.regions
            if r.resource is not None and r.size
        )
        best, cursor, end = 0, self.resource, self.resource + self.size
        for lo, hi in used:
            best = max(best, lo - cursor)
            cursor = max(cursor, hi)
        return max(best, end - cursor)


@dataclass(frozen=True)
class Memdev(_Linked):
    """A CXL memory device (type-3 expander)."""

    name: str
    serial: int | None
    host: str  # PCI address of the device, e.g. '0000:0d:00.0'
    ram_size: int
    pmem_size: int
    numa_node: int | None
    firmware_version: str | None = None
    payload_max: int | None = None
    label_storage_size: int | None = None
    ram_qos_class: int | None = None
    pmem_qos_class: int | None = None
    enabled: bool = True
    # the kernel's debugfs offers poison injection (None: debugfs not readable here)
    poison_injectable: bool | None = None

    def partition_size(self, mode: PartitionMode) -> int:
        """The device's capacity of ``mode``."""
        return {RAM: self.ram_size, PMEM: self.pmem_size}[mode]

    @property
    def endpoint(self) -> Port | None:
        """The memdev's endpoint port (None if not enumerated)."""
        return next((p for p in self._topo().endpoints if p.host == self.name), None)

    @property
    def decoders(self) -> list[Decoder]:
        """The memdev's endpoint decoders."""
        ep = self.endpoint
        return ep.decoders if ep else []

    @property
    def regions(self) -> list[Region]:
        """The regions this memdev is part of."""
        return [r for r in self._topo().regions if self.name in r.memdevs]


@dataclass(frozen=True)
class Mapping:
    """One position of a region's interleave set."""

    position: int
    decoder: str  # endpoint decoder
    memdev: str | None


@dataclass(frozen=True)
class Region(_Linked):
    """A CXL region: host physical address space decoded across memdevs."""

    name: str
    type: PartitionMode
    decoder: str  # root decoder the region is carved from
    resource: int | None
    size: int
    interleave_ways: int
    interleave_granularity: int
    committed: bool
    enabled: bool
    uuid: str | None = None
    mappings: tuple[Mapping, ...] = ()
    # what the platform advertises for it (HMAT to its host bridges, the devices' CDAT)
    access: tuple[AccessFigures, ...] = ()
    # kernels that have them (6.14+): the memory-side cache in front of it, and whether
    # the platform locked its decode; None where the kernel has no such attribute
    extended_linear_cache_size: int | None = None
    locked: bool | None = None

    @property
    def decode_state(self) -> str:
        """'commit' or 'reset', as ndctl prints it."""
        return "commit" if self.committed else "reset"

    @property
    def memdevs(self) -> list[str]:
        """Names of the memdevs mapped, in position order."""
        return [m.memdev for m in self.mappings if m.memdev]

    @property
    def dax_devices(self) -> list[DaxDevice]:
        """The dax devices the region feeds."""
        return [d for d in self._topo().dax_devices if d.region == self.name]

    @property
    def numa_nodes(self) -> list[int]:
        """NUMA nodes its dax devices target."""
        return sorted({d.target_node for d in self.dax_devices if d.target_node is not None})

    @property
    def memdev_nodes(self) -> list[int]:
        """The NUMA nodes (sockets) its memdevs hang off: their host bridges' nodes."""
        topo = self._topo()
        found = (topo.memdev_or_none(m) for m in self.memdevs)
        return sorted({m.numa_node for m in found if m is not None and m.numa_node is not None})


@dataclass(frozen=True)
class DaxDevice(_Linked):
    """A device-dax instance; in system-ram mode its memory is a NUMA node's."""

    name: str
    region: str | None  # the CXL region that feeds it, None for non-CXL dax
    size: int
    resource: int | None
    target_node: int | None
    mode: str  # 'system-ram' (kmem), 'devdax' (device_dax), 'unbound'
    online_memblocks: int = 0
    total_memblocks: int = 0
    movable: bool | None = None  # all online blocks in ZONE_MOVABLE
    zone: str | None = None  # zone of the online blocks: movable, normal or mixed
    align: int | None = None  # bytes: mappings of a devdax device are multiples of it


@dataclass(frozen=True)
class Bus:
    """A CXL root (ndctl calls it a bus): one per platform CXL host (ACPI0017)."""

    name: str
    provider: str
    port: str  # the root port object of this bus (same name)
    # the CXL protocol errors the platform's EINJ can inject (None: no EINJ or debugfs)
    injectable_protocol_errors: tuple[str, ...] | None = None
