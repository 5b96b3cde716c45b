"""What ``pycxl list`` shows, as a library call: selection, filters and JSON shaping.

The CLI renders the result; scripts can call ``list_json`` directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .cxl import ndctl_json as nj
from .cxl.model import Bus, DaxDevice, Decoder, Memdev, Port, Region
from .cxl.topology import CxlTopology
from .errors import NotFoundError
from .gpu.devices import GpuDevice
from .system import System
from .tiers import NodeTier

DECODER_KINDS = ("root", "switch", "endpoint")


@dataclass(frozen=True)
class ListRequest:
    memdevs: bool = False
    decoders: bool = False
    regions: bool = False
    buses: bool = False
    ports: bool = False
    endpoints: bool = False
    targets: bool = False
    dax: bool = False
    numa: bool = False
    gpus: bool = False
    include_disabled: bool = False
    human: bool = False
    memdev_filter: tuple[str, ...] = ()
    decoder_filter: tuple[str, ...] = ()
    region_filter: tuple[str, ...] = ()
    bus_filter: tuple[str, ...] = ()

    @property
    def summary(self) -> bool:
        """No object kind asked for: the at-a-glance summary."""
        return not any(
            (self.memdevs, self.decoders, self.regions, self.buses, self.ports,
             self.endpoints, self.dax, self.numa, self.gpus)
        )  # fmt: skip


@dataclass(frozen=True)
class Selection:
    buses: list[Bus]
    ports: list[Port]
    endpoints: list[Port]
    decoders: list[Decoder]
    memdevs: list[Memdev]
    regions: list[Region]
    dax: list[DaxDevice]
    nodes: list[NodeTier]
    gpus: list[GpuDevice]


def select(system: System, req: ListRequest) -> Selection:
    """Apply the filters; raises NotFoundError for a filter that matches nothing known."""
    cxl = system.cxl
    memdevs = list(cxl.memdevs)
    ports = list(cxl.ports)
    endpoints = list(cxl.endpoints)
    decoders = list(cxl.decoders)
    regions = list(cxl.regions)
    buses = list(cxl.buses)
    if req.bus_filter:
        wanted = _match(req.bus_filter, buses, "bus", lambda b: (b.name, b.provider))
        keep = {b.port for b in wanted}
        under = {p.name for p in cxl.all_ports if _root_of(cxl, p) in keep}
        buses = [b for b in buses if b.name in keep]
        ports = [p for p in ports if p.name in under]
        endpoints = [p for p in endpoints if p.name in under]
        decoders = [d for d in decoders if d.port in under]
        memdevs = [m for m in memdevs if m.endpoint and m.endpoint.name in under]
        regions = [r for r in regions if cxl.decoder(r.decoder).port in under]
    if req.memdev_filter:
        chosen = {cxl.find_memdev(i).name for i in req.memdev_filter}
        memdevs = [m for m in memdevs if m.name in chosen]
        path = set()
        for m in memdevs:
            p = m.endpoint
            while p is not None:
                path.add(p.name)
                p = p.parent_port
        ports = [p for p in ports if p.name in path]
        endpoints = [p for p in endpoints if p.name in path]
        decoders = [d for d in decoders if d.port in path]
        regions = [r for r in regions if chosen & set(r.memdevs)]
    if req.region_filter:
        wanted_r = _match(req.region_filter, regions, "region", lambda r: (r.name,))
        names = {r.name for r in wanted_r}
        regions = wanted_r
        members = {m for r in wanted_r for m in r.memdevs}
        memdevs = [m for m in memdevs if m.name in members]
        decoders = [
            d for d in decoders if d.region in names or d.name in {r.decoder for r in wanted_r}
        ]
    if req.decoder_filter:
        kinds = {f for f in req.decoder_filter if f in DECODER_KINDS}
        named = tuple(f for f in req.decoder_filter if f not in DECODER_KINDS and f != "all")
        if "all" not in req.decoder_filter:
            by_name = {d.name for d in _match(named, decoders, "decoder", lambda d: (d.name,))}
            decoders = [d for d in decoders if d.kind in kinds or d.name in by_name]
    if not req.include_disabled:
        decoders = [d for d in decoders if d.enabled]
        memdevs = [m for m in memdevs if m.enabled]
        ports = [p for p in ports if p.enabled]
        endpoints = [p for p in endpoints if p.enabled]
        regions = [r for r in regions if r.enabled or r.committed]
    dax = [d for d in cxl.dax_devices if d.region in {r.name for r in regions}]
    return Selection(
        buses=buses,
        ports=ports,
        endpoints=endpoints,
        decoders=decoders,
        memdevs=memdevs,
        regions=regions,
        dax=dax,
        nodes=list(system.nodes),
        gpus=list(system.gpus.devices),
    )


def _root_of(cxl: CxlTopology, port: Port) -> str:
    p = port
    while p.parent is not None:
        p = cxl.port(p.parent)
    return p.name


def _match(idents: tuple[str, ...], items: list[Any], kind: str, keys: Any) -> list[Any]:
    out = []
    for ident in idents:
        hits = [o for o in items if ident in keys(o)]
        if not hits:
            raise NotFoundError(kind, ident, [k for o in items for k in keys(o)[:1]])
        out += [h for h in hits if h not in out]
    return out


# --- JSON ---------------------------------------------------------------------
def node_json(nt: NodeTier) -> dict[str, Any]:
    n = nt.node
    j: dict[str, Any] = {
        "node": n.id,
        "name": nt.name,
        "tier": nt.tier,
        "cpus": list(n.cpus),
        "mem_total": n.mem_total,
        "mem_free": n.mem_free,
        "distances": {str(k): v for k, v in n.distances.items()},
    }
    if nt.region:
        j["region"] = nt.region
    if nt.explicit:
        j["explicit"] = True
    return j


def gpu_json(g: GpuDevice) -> dict[str, Any]:
    return {
        "gpu": g.target_name,
        "ordinal": g.ordinal,
        "name": g.name,
        "uuid": g.uuid,
        "pci_bus_id": g.pci_bus_id,
        "total_memory": g.total_memory,
        "sm_count": g.sm_count,
        "compute_capability": f"{g.compute_capability[0]}.{g.compute_capability[1]}",
        "numa_node": g.numa_node,
        "numa_node_source": g.numa_node_source,
        # what matters for host memory: zero-copy mapping, pageable access, registration
        "can_map_host_memory": g.can_map_host_memory,
        "pageable_memory_access": g.pageable_memory_access,
        "host_register_supported": g.host_register_supported,
        "unified_addressing": g.unified_addressing,
        "async_engines": g.async_engines,
        "l2_cache": g.l2_cache,
    }


def list_json(system: System, req: ListRequest) -> Any:
    """The JSON document ``pycxl list --json`` prints for this request.

    Like ``cxl list``: one kind of object gives a flat array; several give an array of
    single-key objects ('memdevs', 'root decoders', ...). With no kind asked for, an
    object summarising memdevs, regions, NUMA nodes and GPUs, with what is absent.
    """
    sel = select(system, req)
    h, t = req.human, req.targets
    if req.summary:
        return {
            "memdevs": [nj.memdev_json(m, h) for m in sel.memdevs],
            "regions": [nj.region_json(r, True, h) for r in sel.regions],
            "numa_nodes": [node_json(n) for n in sel.nodes],
            "gpus": [gpu_json(g) for g in sel.gpus],
            "absent": system.absent,
        }
    groups: list[tuple[str, list[Any]]] = []
    if req.buses:
        groups.append(("buses", [nj.bus_json(b) for b in sel.buses]))
    if req.ports:
        groups.append(("ports", [nj.port_json(p, t, h) for p in sel.ports if p.kind != "root"]))
    if req.endpoints:
        groups.append(("endpoints", [nj.port_json(p, t, h) for p in sel.endpoints]))
    if req.memdevs:
        groups.append(("memdevs", [nj.memdev_json(m, h) for m in sel.memdevs]))
    if req.decoders:
        for kind, label in (("root", "root decoders"), ("switch", "port decoders"),
                            ("endpoint", "endpoint decoders")):  # fmt: skip
            items = [nj.decoder_json(d, t, h) for d in sel.decoders if d.kind == kind]
            if items:
                groups.append((label, items))
    if req.regions:
        groups.append(("regions", [nj.region_json(r, t, h) for r in sel.regions]))
    if req.dax:
        groups.append(("dax", [nj.dax_json(d, h) for d in sel.dax]))
    if req.numa:
        groups.append(("numa_nodes", [node_json(n) for n in sel.nodes]))
    if req.gpus:
        groups.append(("gpus", [gpu_json(g) for g in sel.gpus]))
    groups = [(k, v) for k, v in groups if v]
    if len(groups) == 1:
        return groups[0][1]
    return [{k: v} for k, v in groups]
