"""The container of one CXL snapshot, and navigation across its objects."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..base.errors import NotAvailableError, NotFoundError, _natural_key

if TYPE_CHECKING:  # the model loads where there is CXL to read (a backend imports it)
    from .model import Bus, DaxDevice, Decoder, Memdev, Port, Region, _Linked

T = TypeVar("T")
L = TypeVar("L", bound="_Linked")


@dataclass(frozen=True, repr=False)
class CxlTopology:
    """Everything the kernel reports about CXL at one moment.

    ``present`` is False when the kernel has no CXL bus (drivers not loaded or no
    hardware); every list is then empty.
    """

    present: bool
    buses: tuple[Bus, ...] = ()
    ports: tuple[Port, ...] = ()  # root and switch ports
    endpoints: tuple[Port, ...] = ()
    decoders: tuple[Decoder, ...] = ()
    memdevs: tuple[Memdev, ...] = ()
    regions: tuple[Region, ...] = ()
    dax_devices: tuple[DaxDevice, ...] = ()
    source: str = field(default="sysfs", compare=False)

    @classmethod
    def build(
        cls,
        *,
        buses: Iterable[Bus] = (),
        ports: Iterable[Port] = (),
        endpoints: Iterable[Port] = (),
        decoders: Iterable[Decoder] = (),
        memdevs: Iterable[Memdev] = (),
        regions: Iterable[Region] = (),
        dax_devices: Iterable[DaxDevice] = (),
        source: str = "sysfs",
    ) -> CxlTopology:
        """Assemble a topology and attach each object to it (sorted naturally)."""
        topo = cls(present=True, source=source)
        # Frozen, so filled in place once, before anyone else sees the object.
        object.__setattr__(topo, "buses", tuple(_sorted(buses)))
        object.__setattr__(topo, "ports", _attach(ports, topo))
        object.__setattr__(topo, "endpoints", _attach(endpoints, topo))
        object.__setattr__(topo, "decoders", _attach(decoders, topo))
        object.__setattr__(topo, "memdevs", _attach(memdevs, topo))
        object.__setattr__(topo, "regions", _attach(regions, topo))
        object.__setattr__(topo, "dax_devices", _attach(dax_devices, topo))
        return topo

    def __repr__(self) -> str:
        if not self.present:
            return "CxlTopology(no CXL bus)"
        names = ", ".join(
            f"{kind}=[{', '.join(o.name for o in getattr(self, kind))}]"
            for kind in ("memdevs", "regions", "dax_devices")
        )
        return f"CxlTopology({len(self.decoders)} decoders, {names})"

    NO_BUS = (
        "no CXL bus: the CXL drivers are not loaded or there is no CXL hardware "
        "(modprobe cxl_acpi cxl_pci cxl_mem)"
    )

    def require(self) -> CxlTopology:
        """This topology, or NotAvailableError when the kernel has no CXL bus."""
        if not self.present:
            raise NotAvailableError(self.NO_BUS)
        return self

    # --- lookup --------------------------------------------------------------
    @property
    def all_ports(self) -> tuple[Port, ...]:
        """Root, switch and endpoint ports together."""
        return self.ports + self.endpoints

    def port(self, name: str) -> Port:
        """A port or endpoint by name; NotFoundError lists the known ones."""
        return _find(self.all_ports, name, "port")

    def decoder(self, name: str) -> Decoder:
        """A decoder by name; NotFoundError lists the known ones."""
        return _find(self.decoders, name, "decoder")

    def memdev(self, name: str) -> Memdev:
        """A memdev by name; NotFoundError lists the known ones."""
        return _find(self.memdevs, name, "memdev")

    def memdev_or_none(self, name: str) -> Memdev | None:
        """A memdev by name, or None."""
        return next((m for m in self.memdevs if m.name == name), None)

    def region(self, name: str) -> Region:
        """A region by name; NotFoundError lists the known ones."""
        return _find(self.regions, name, "region")

    def root_decoders(self) -> list[Decoder]:
        """The root decoders (one per CXL window)."""
        return [d for d in self.decoders if d.kind == "root"]

    def find_memdev(self, ident: str) -> Memdev:
        """A memdev by name ('mem0'), serial ('0x1' or '1') or host PCI address."""
        for m in self.memdevs:
            if ident in (m.name, m.host) or _serial_matches(m.serial, ident):
                return m
        known = [m.name for m in self.memdevs]
        raise NotFoundError("memdev", ident, known)

    def bus_of(self, port: Port) -> Bus | None:
        """The bus (CXL root) a port hangs under."""
        p: Port | None = port
        while p is not None and p.parent is not None:
            p = self.port(p.parent)
        return next((b for b in self.buses if p is not None and b.port == p.name), None)

    def node_zones(self) -> dict[int, str]:
        """NUMA node id -> zone of the CXL memory online there (movable, normal, mixed)."""
        by_node: dict[int, list[Any]] = {}
        for d in self.dax_devices:
            if d.target_node is not None and d.mode == "system-ram" and d.zone is not None:
                by_node.setdefault(d.target_node, []).append(d.zone)
        if not by_node:
            return {}
        from .memory_blocks import combine_zones

        return {n: z for n, zs in by_node.items() if (z := combine_zones(zs)) is not None}

    def node_memdev_nodes(self) -> dict[int, tuple[int, ...]]:
        """NUMA node id -> the nodes (sockets) the memdevs of its CXL regions hang off."""
        out: dict[int, set[int]] = {}
        for d in self.dax_devices:
            if d.region is not None and d.target_node is not None and d.mode == "system-ram":
                region = next((r for r in self.regions if r.name == d.region), None)
                if region is not None:
                    out.setdefault(d.target_node, set()).update(region.memdev_nodes)
        return {n: tuple(sorted(s)) for n, s in out.items()}

    def node_to_region(self) -> dict[int, str]:
        """NUMA node id -> CXL region name, for nodes fed by a CXL region's dax device."""
        out: dict[int, str] = {}
        for d in self.dax_devices:
            if d.region is not None and d.target_node is not None and d.mode == "system-ram":
                out.setdefault(d.target_node, d.region)
        return out


def _serial_matches(serial: int | None, ident: str) -> bool:
    if serial is None:
        return False
    try:
        return int(ident, 0) == serial
    except ValueError:
        return False


def _sorted(items: Iterable[T]) -> list[T]:
    return sorted(items, key=lambda o: _natural_key(getattr(o, "name", "")))


def _find(items: Sequence[T], name: str, kind: str) -> T:
    for o in items:
        if getattr(o, "name", None) == name:
            return o
    raise NotFoundError(kind, name, [getattr(o, "name", "") for o in items])


def _attach(items: Iterable[L], topo: CxlTopology) -> tuple[L, ...]:
    """Copies of the objects, sorted by name, each knowing its topology."""
    return tuple(dataclasses.replace(o, topology=topo) for o in _sorted(items))
