"""What ``pycxl list`` shows, as a library call: the kinds of object, one filter per
kind (as ndctl's filter.c), and the JSON document.

The kinds are declared once, in ``pycxl.base.list_kinds.KINDS``; the CLI makes its flags
from them. As in ``cxl list``, a filter given without any kind flag lists its own kind
(``-m mem0`` lists that memdev, ``-d root`` the root decoders); with kind flags, filters
narrow every kind they relate to (``-D -m mem0``: the decoders on mem0's path). With
neither, a summary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ..base.errors import InvalidRequestError, NotFoundError
from ..base.list_kinds import KIND_NAMES, KINDS, SINGULAR, SUMMARY_KINDS
from ..base.values import ascii_digits, instance, is_digits, is_hex, serial

if TYPE_CHECKING:
    # the CXL model loads only where there is CXL, the JSON builders only for --json,
    # and the memdevs' mailbox answers (memdev_health) only for -H, -A, -L
    from ..base.jsontype import Json
    from ..cxl.model import Bus, DaxDevice, Decoder, Memdev, Port, Region
    from ..cxl.topology import CxlTopology
    from ..gpu.inventory import GpuDevice
    from ..resolve.system import System
    from ..resolve.tiers import NodeTier

PORT_CLASSES = ("root", "switch", "endpoint")
# what cxl list -v adds: every CXL object kind but memdevs (and dax devices, at -vvv)
VERBOSE_KINDS = ("buses", "ports", "endpoints", "decoders", "regions")


@dataclass(frozen=True)
class ListRequest:
    """Which kinds to show, the filters (idents per kind: ``{"memdevs": ("mem0",)}``),
    and how: ``targets`` (decoder targets, dports, region mappings), ``include_disabled``,
    ``human`` (ndctl's -u forms in JSON). ``serials`` filter memdevs by serial number."""

    kinds: frozenset[str] = frozenset()
    filters: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    serials: tuple[str, ...] = ()
    targets: bool = False
    include_disabled: bool = False
    human: bool = False
    health: bool = False  # memdevs' health from their mailboxes (root)
    alert_config: bool = False  # memdevs' alert thresholds (root)
    media_errors: bool = False  # memdevs' poison lists (root)

    @classmethod
    def showing(cls, *kinds: str, **options: Any) -> ListRequest:
        """``ListRequest.showing("memdevs", "regions", targets=True)``."""
        return cls(kinds=frozenset(kinds), **options)

    def __post_init__(self) -> None:
        if isinstance(self.kinds, str) or not isinstance(self.kinds, Iterable):
            raise InvalidRequestError(f"kinds {self.kinds!r}: give a set of kinds such as "
                                      "{'memdevs', 'regions'}")  # fmt: skip
        if not isinstance(self.filters, dict) or not all(
            isinstance(v, tuple | list) and all(isinstance(i, str) for i in v)
            for v in self.filters.values()
        ):  # fmt: skip
            raise InvalidRequestError(f"filters {self.filters!r}: give kinds mapped to names, "
                                      "such as {'memdevs': ('mem0',)}")  # fmt: skip
        if not isinstance(self.serials, tuple | list) or not all(
            isinstance(v, str) for v in self.serials
        ):  # fmt: skip
            raise InvalidRequestError(f"serials {self.serials!r}: give a tuple of serials")
        for kind, idents in [*self.filters.items(), ("serials", self.serials)]:
            if (kind != "serials" and not idents) or any(not i.strip() for i in idents):
                raise InvalidRequestError(
                    f"filter {kind} {tuple(idents)!r} names nothing: give names such as "
                    "('mem0',), or leave the filter out"
                )
        for kind, idents in self.filters.items():
            for i in idents:
                ascii_digits(i, f"filter {kind}")
        for s in self.serials:
            serial(s)
        unknown = [k for k in [*self.kinds, *self.filters] if k not in KIND_NAMES]
        if unknown:
            raise NotFoundError("object kind", unknown[0], KIND_NAMES)

    def verbose(self, level: int) -> ListRequest:
        """This request with ``cxl list``'s -v (``level`` 1), -vv (2) or -vvv (3):

        - 1: buses, ports, endpoints, decoders (with targets) and regions, besides the
          kinds asked for (memdevs and regions when no CXL kind is named or implied by a
          filter, as cxl list lists by default);
        - 2: also disabled objects (--idle);
        - 3: also the memdevs' health, alert thresholds and media errors, and the dax
          devices (ndctl's -vvv also turns on --partition, which pycxl has no
          equivalent of, and --firmware, whose fields pycxl always shows).
        """
        if level <= 0:
            return self
        cxl = {k.name for k in KINDS if k.cxl}
        named = (set(self.shown) & cxl) or {"memdevs", "regions"}
        kinds = set(self.shown) | named | set(VERBOSE_KINDS)
        if level >= 3:
            kinds.add("dax")
        return dataclasses.replace(
            self, kinds=frozenset(kinds), targets=True,
            include_disabled=self.include_disabled or level >= 2,
            health=self.health or level >= 3,
            alert_config=self.alert_config or level >= 3,
            media_errors=self.media_errors or level >= 3,
        )  # fmt: skip

    @property
    def shown(self) -> frozenset[str]:
        """The kinds listed: those asked for, else those the filters imply."""
        if self.kinds:
            return self.kinds
        implied = {k for k, v in self.filters.items() if v}
        if self.serials or self.device_info:
            implied.add("memdevs")
        return frozenset(implied)

    @property
    def device_info(self) -> bool:
        """Whether anything is asked of the devices themselves (their mailboxes)."""
        return self.health or self.alert_config or self.media_errors

    @property
    def summary(self) -> bool:
        """Neither a kind nor a filter: the at-a-glance summary."""
        return not self.shown


class Selection(NamedTuple):
    """The objects of each kind that pass the filters. (A named tuple: made on every
    ``pycxl list``, whose start-up a dataclass's definition would cost a millisecond.)"""

    buses: list[Bus]
    ports: list[Port]
    endpoints: list[Port]
    memdevs: list[Memdev]
    decoders: list[Decoder]
    regions: list[Region]
    dax: list[DaxDevice]
    numa: list[NodeTier]
    gpus: list[GpuDevice]


# --- one filter per kind: does this object match one of the idents? ---------------------
def _number(ident: str, prefix: str) -> int | None:
    text = ident.removeprefix(prefix)
    return int(text) if is_digits(text) else None


def bus_matches(b: Bus, ident: str) -> bool:
    """Filter for buses: 'all', the name (root0), its number, or the provider."""
    return ident in ("all", b.name, b.provider) or _number(ident, "root") == _number(b.name, "root")


def port_matches(p: Port, ident: str) -> bool:
    """Filter for ports: 'all', root/switch/endpoint, the name, or portN's number."""
    if ident in ("all", p.name) or ident == p.kind:
        return True
    num = _number(ident, "port")
    return num is not None and p.kind == "switch" and num == _number(p.name, "port")


def endpoint_matches(p: Port, ident: str) -> bool:
    """Filter for endpoints: 'all', the name, or endpointN's number."""
    num = _number(ident, "endpoint")
    return ident in ("all", p.name) or (num is not None and num == _number(p.name, "endpoint"))


def memdev_matches(m: Memdev, ident: str) -> bool:
    """Filter for memdevs: 'all', the name, its number, the host, or a 0x serial."""
    if ident in ("all", m.name, m.host):
        return True
    num = _number(ident, "mem")
    if num is not None and num == _number(m.name, "mem"):
        return True
    return serial_matches(m, ident) and not is_digits(ident)  # '1' is mem1, '0x1' a serial


def serial_matches(m: Memdev, ident: str) -> bool:
    """Filter for memdevs by serial number (ASCII decimal or 0x hex)."""
    if m.serial is None or not (is_digits(ident) or is_hex(ident)):
        return False
    return int(ident, 16 if is_hex(ident) else 10) == m.serial


def decoder_matches(d: Decoder, ident: str) -> bool:
    """Filter for decoders: 'all', root/switch/endpoint, the name, or X.Y."""
    if ident in ("all", d.name) or ident == d.kind:
        return True
    return d.name == f"decoder{ident}"  # '0.0' is decoder0.0


def region_matches(r: Region, ident: str) -> bool:
    """Filter for regions: 'all', the name, or regionN's number."""
    num = _number(ident, "region")
    return ident in ("all", r.name) or (num is not None and num == _number(r.name, "region"))


_WORDS = {
    "buses": ("all",),
    "ports": ("all", *PORT_CLASSES),
    "endpoints": ("all",),
    "memdevs": ("all",),
    "decoders": ("all", *PORT_CLASSES),
    "regions": ("all",),
}


def _pick(kind: str, items: Sequence[Any], idents: Iterable[str],
          matches: Callable[[Any, str], bool]) -> list[Any]:  # fmt: skip
    """Items matching any ident; an ident (other than all/root/...) matching nothing is
    NotFoundError naming those that exist."""
    out: list[Any] = []
    for ident in idents:
        hits = [o for o in items if matches(o, ident)]
        if not hits and ident not in _WORDS.get(kind, ()):
            raise NotFoundError(SINGULAR[kind], ident, [o.name for o in items])
        out += [h for h in hits if h not in out]
    return out


def pick_regions(cxl: CxlTopology, idents: Sequence[str],
                 root_decoder: str | None = None) -> list[str]:  # fmt: skip
    """The regions a region command acts on, by ndctl's filters: each ident a region's
    name, its number or 'all'; ``root_decoder`` (decoder0.0 or 0.0) narrows them to one
    CXL window's. An ident or a root decoder that names nothing is NotFoundError, and so
    is a region named outside the root decoder given (the filter is applied, never
    dropped)."""
    if not idents:
        raise InvalidRequestError("name a region (region0), or all")
    regions = list(cxl.regions)
    if root_decoder is not None:
        ascii_digits(root_decoder, "root decoder")
        roots = cxl.root_decoders()
        root = next((d for d in roots if d.name in (root_decoder, f"decoder{root_decoder}")),
                    None)  # fmt: skip
        if root is None:
            raise NotFoundError("root decoder", root_decoder, [d.name for d in roots])
        outside = [r for r in _pick("regions", regions, idents, region_matches)
                   if r.decoder != root.name and "all" not in idents]  # fmt: skip
        if outside:
            r = outside[0]
            raise NotFoundError(
                "region",
                r.name,
                [x.name for x in regions if x.decoder == root.name],
                problem=f"{r.name} is under {r.decoder}, not {root.name}",
            )
        regions = [r for r in regions if r.decoder == root.name]
    return [r.name for r in _pick("regions", regions, idents, region_matches)]


def select(system: System, req: ListRequest) -> Selection:
    """Apply the filters: each narrows its own kind and every kind related to it."""
    cxl = system.cxl
    buses, ports, endpoints = list(cxl.buses), list(cxl.ports), list(cxl.endpoints)
    memdevs, decoders, regions = list(cxl.memdevs), list(cxl.decoders), list(cxl.regions)
    f = req.filters
    if f.get("memdevs") or req.serials:
        chosen = _pick("memdevs", memdevs, f.get("memdevs", ()), memdev_matches)
        if req.serials:
            by_serial = _pick("memdevs", memdevs, req.serials, serial_matches)
            chosen = [m for m in chosen if m in by_serial] if f.get("memdevs") else by_serial
        path = _ports_above(m.endpoint for m in chosen)
        memdevs = chosen
        buses = [b for b in buses if b.port in path]
        ports = [p for p in ports if p.name in path]
        endpoints = [p for p in endpoints if p.name in path]
        decoders = [d for d in decoders if d.port in path]
        regions = [r for r in regions if {m.name for m in chosen} & set(r.memdevs)]
    if f.get("buses"):
        roots = {b.port for b in _pick("buses", buses, f["buses"], bus_matches)}
        under = {p.name for p in cxl.all_ports if _root_of(cxl, p) in roots}
        buses = [b for b in buses if b.port in roots]
        ports = [p for p in ports if p.name in under]
        endpoints = [p for p in endpoints if p.name in under]
        decoders = [d for d in decoders if d.port in under]
        memdevs = [m for m in memdevs if m.endpoint and m.endpoint.name in under]
        regions = [r for r in regions if cxl.decoder(r.decoder).port in under]
    if f.get("ports"):
        chosen_p = _pick("ports", ports + endpoints, f["ports"], port_matches)
        below = _ports_below(cxl, chosen_p)
        ports = [p for p in ports if p in chosen_p]
        endpoints = [p for p in endpoints if p.name in below]
        decoders = [d for d in decoders if d.port in {p.name for p in chosen_p}]
        memdevs = [m for m in memdevs if m.endpoint and m.endpoint.name in below]
    if f.get("endpoints"):
        chosen_e = _pick("endpoints", endpoints, f["endpoints"], endpoint_matches)
        names = {p.name for p in chosen_e}
        endpoints = chosen_e
        decoders = [d for d in decoders if d.port in names]
        memdevs = [m for m in memdevs if m.endpoint and m.endpoint.name in names]
    if f.get("decoders"):
        chosen_d = _pick("decoders", decoders, f["decoders"], decoder_matches)
        below = _ports_below(cxl, [cxl.port(d.port) for d in chosen_d])
        decoders = chosen_d
        memdevs = [m for m in memdevs if m.endpoint and m.endpoint.name in below]
    if f.get("regions"):
        chosen_r = _pick("regions", regions, f["regions"], region_matches)
        names = {r.name for r in chosen_r}
        members = {m for r in chosen_r for m in r.memdevs}
        regions = chosen_r
        memdevs = [m for m in memdevs if m.name in members]
        decoders = [d for d in decoders
                    if d.region in names or d.name in {r.decoder for r in chosen_r}]  # fmt: skip
    if not req.include_disabled:
        decoders = [d for d in decoders if d.enabled]
        memdevs = [m for m in memdevs if m.enabled]
        ports = [p for p in ports if p.enabled]
        endpoints = [p for p in endpoints if p.enabled]
        regions = [r for r in regions if r.enabled or r.committed]
    kept = {r.name for r in regions}
    return Selection(
        buses=buses, ports=ports, endpoints=endpoints, memdevs=memdevs, decoders=decoders,
        regions=regions, dax=[d for d in cxl.dax_devices if d.region in kept],
        numa=list(system.nodes), gpus=list(system.gpus.devices),
    )  # fmt: skip


def _ports_above(endpoints: Iterable[Port | None]) -> set[str]:
    path: set[str] = set()
    for p in endpoints:
        while p is not None:
            path.add(p.name)
            p = p.parent_port
    return path


def _ports_below(cxl: CxlTopology, tops: Iterable[Port]) -> set[str]:
    names = {p.name for p in tops}
    return {p.name for p in cxl.all_ports if names & _ports_above([p])}


def _root_of(cxl: CxlTopology, port: Port) -> str:
    p = port
    while p.parent is not None:
        p = cxl.port(p.parent)
    return p.name


# --- JSON ------------------------------------------------------------------------------
def kind_json(
    kind: str, sel: Selection, req: ListRequest, extras: dict[str, Json] | None = None
) -> list[Any]:
    """The JSON objects of one kind in the selection (``extras``: keys to add to each
    memdev, from ``device_json``)."""
    from . import to_json as js  # the JSON builders load for --json only

    h, t = req.human, req.targets
    more = extras or {}
    builders: dict[str, Callable[[], list[Any]]] = {
        "buses": lambda: [js.bus_json(b) for b in sel.buses],
        "ports": lambda: [js.port_json(p, t, h) for p in sel.ports if p.kind != "root"],
        "endpoints": lambda: [js.port_json(p, t, h) for p in sel.endpoints],
        "memdevs": lambda: [js.memdev_json(m, h) | more.get(m.name, {}) for m in sel.memdevs],
        "decoders": lambda: [js.decoder_json(d, t, h) for d in sel.decoders],
        "regions": lambda: [js.region_json(r, t, h) for r in sel.regions],
        "dax": lambda: [js.dax_json(d, h) for d in sel.dax],
        "numa": lambda: [js.node_json(n) for n in sel.numa],
        "gpus": lambda: [js.gpu_json(g) | more.get(g.target_name, {}) for g in sel.gpus],
    }
    return builders[kind]()


def device_links(system: System, sel: Selection) -> dict[str, Any]:
    """The PCIe link of each memdev and GPU selected (by memdev and GPU name; None for a
    device without one), and each memdev's CXL capability (``lspci -vv``'s view)."""
    from ..pci.caps import read_cxl_capability
    from ..pci.link import read_link

    fs = system.sysfs()
    out: dict[str, Any] = {m.name: (read_link(m.host, fs), read_cxl_capability(m.host, fs))
                           for m in sel.memdevs}  # fmt: skip
    out |= {g.target_name: (read_link(g.pci_bus_id, fs), None) for g in sel.gpus}
    return out


# ndctl's container names: decoders are split by level
DECODER_GROUPS = (("root", "root decoders"), ("switch", "port decoders"),
                  ("endpoint", "endpoint decoders"))  # fmt: skip
CONTAINERS = {k.name: k.json_name for k in KINDS}


def list_json(system: System, req: ListRequest) -> Any:
    """The JSON document ``pycxl list --json`` prints for this request.

    Like ``cxl list``: one kind of object gives a flat array; several give an array of
    single-key objects ('memdevs', 'root decoders', ...). The summary is an object with
    'memdevs', 'regions', 'numa_nodes', 'gpus' and 'absent' (what this host lacks).
    """
    from ..resolve.system import System
    from . import to_json as js  # the JSON builders load for --json only

    instance(system, System, "system", "a System (pycxl.snapshot())")
    instance(req, ListRequest, "request", "a ListRequest, such as ListRequest.showing('memdevs')")
    sel = select(system, req)
    extras: dict[str, Json] = {}
    for name, (link, cxl) in device_links(system, sel).items():
        extras[name] = {"pcie_link": js.pcie_link_json(link)}
        if name in {m.name for m in sel.memdevs}:
            extras[name]["cxl_capability"] = js.cxl_capability_json(cxl)
    if req.device_info:
        from .memdev_health import device_json, read_device_info

        for name, info in read_device_info(system, sel.memdevs, req).items():
            extras[name] = extras.get(name, {}) | device_json(system, info, req)
    if req.summary:
        doc: dict[str, Any] = {CONTAINERS[k]: kind_json(k, sel, req, extras)
                               for k in SUMMARY_KINDS}  # fmt: skip
        doc["regions"] = [js.region_json(r, True, req.human) for r in sel.regions]
        doc["absent"] = system.absent
        return doc
    groups: list[tuple[str, list[Any]]] = []
    for kind in KIND_NAMES:
        if kind not in req.shown:
            continue
        items = kind_json(kind, sel, req, extras)
        if kind == "decoders":
            groups += [
                (label, [j for j, d in zip(items, sel.decoders, strict=True) if d.kind == level])
                for level, label in DECODER_GROUPS
            ]
        else:
            groups.append((CONTAINERS[kind], items))
    groups = [(k, v) for k, v in groups if v]
    if len(groups) == 1:
        return groups[0][1]
    return [{k: v} for k, v in groups]
