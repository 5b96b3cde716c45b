"""What a new region will look like, decided and validated before anything is written.

From a request (memdevs, ways, granularity, size, type, root decoder; all optional) and
the current topology, ``layout_region`` picks what was left out, orders the memdevs
into the interleave positions the hardware decode requires, and rejects anything the
kernel would refuse, with a message that names the problem and the fix.

Position rule (CXL 3.x 9.13.1, and the kernel's ``cxl_region_attach_position``): a
host address chunk k goes to root target ``k mod root_ways``, then inside that host
bridge (or switch) to its dport ``(k div root_ways) mod hb_ways``, and so on down. So
position p of the region must sit under root target ``p mod root_ways``, etc.
"""

from __future__ import annotations

import itertools
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass

from ..base import values
from ..base.errors import InvalidRequestError, NotFoundError, _natural_key
from ..base.units import format_size
from ..base.values import (
    PARTITION_MODES,
    PMEM,
    RAM,
    PartitionMode,
    ascii_digits,
    count,
    optional_size,
    word,
)
from .dax import check_mode
from .memory_blocks import Zone, check_zone
from .model import Decoder, Memdev
from .topology import CxlTopology

MIN_GRANULARITY, MAX_GRANULARITY = 256, 16384
# Each device's share of a region (its DPA allocation) must be a multiple of 256 MiB.
DPA_ALIGN = 256 << 20


@dataclass(frozen=True, init=False)
class RegionRequest:
    """What the user asked for; None means 'pick for me'.

    The constructor is the door: it checks each value once (``pycxl.base.values``) and keeps
    it typed, so sizes given as text ("512M") are held as bytes and nothing below reads
    them again. The physical limits (valid ways, granularity, alignment) are the
    layout's, decided against the topology."""

    memdevs: tuple[str, ...]  # names, serials or host PCI addresses
    ways: int | None
    granularity: int | None  # bytes
    size: int | None  # bytes
    type: PartitionMode | None
    decoder: str | None  # root decoder
    bus: str | None  # only root decoders of this bus (name, id or provider)
    uuid: str | None  # pmem only
    online: bool
    # normal: long-term pins (GPU registration) stay on the node; movable: the memory
    # can always be offlined, but the kernel moves pinned pages to another node. None:
    # normal. Only memory that goes online has a zone.
    zone: Zone | None
    # system-ram: the memory becomes a NUMA node; devdax: /dev/daxX.Y, mapped by programs
    mode: str

    def __init__(
        self,
        memdevs: Sequence[str] | str = (),
        ways: int | None = None,
        granularity: int | str | None = None,  # bytes, or a string such as "4k"
        size: int | str | None = None,  # bytes, or a string such as "512M"
        type: PartitionMode | None = None,
        decoder: str | None = None,
        bus: str | None = None,
        uuid: str | None = None,
        online: bool = True,
        zone: Zone | None = None,
        mode: str = "system-ram",
    ) -> None:
        if type is not None:
            word(type, "type", PARTITION_MODES)
        check_mode(mode)
        if zone is not None:
            check_zone(zone)
            if mode == "devdax" or not online:
                why = "mode devdax maps the memory as a device" if online else (
                    "online=False leaves the memory offline")  # fmt: skip
                raise InvalidRequestError(
                    f"zone {zone}: {why}, so it goes into no zone; leave the zone out, "
                    "or online the memory as system-ram"
                )
        names = (memdevs,) if isinstance(memdevs, str) else memdevs  # one name, not its letters
        if not isinstance(names, tuple | list) or not all(isinstance(m, str) for m in names):
            raise InvalidRequestError(f"memdevs {memdevs!r}: give names such as ('mem0',)")
        for name, value in (("decoder", decoder), ("bus", bus), ("uuid", uuid)):
            if value is not None and not isinstance(value, str):
                raise InvalidRequestError(f"{name} {value!r}: give a name")
            if value is not None:
                ascii_digits(value, name)
        for name in names:
            ascii_digits(name, "memdev")
        fields: dict[str, object] = dict(
            memdevs=tuple(names),
            ways=None if ways is None else count(ways, "ways"),
            granularity=optional_size(granularity, "granularity"),
            size=optional_size(size, "size"),
            type=type, decoder=decoder, bus=bus, uuid=uuid, online=online, zone=zone,
            mode=mode,
        )  # fmt: skip
        for key, held in fields.items():  # frozen: set once, here
            object.__setattr__(self, key, held)

    @property
    def online_zone(self) -> Zone:
        """The zone the memory goes online into."""
        return self.zone or "normal"

    @property
    def size_bytes(self) -> int | None:
        """``size`` (kept for callers of the earlier name: it was always bytes)."""
        return self.size

    @property
    def granularity_bytes(self) -> int | None:
        """``granularity`` (as ``size_bytes``)."""
        return self.granularity


@dataclass(frozen=True)
class RegionTarget:
    position: int
    memdev: Memdev
    decoder: Decoder  # the endpoint decoder that will map this position


@dataclass(frozen=True)
class RegionLayout:
    """A fully decided region: everything the plan writes."""

    root: Decoder
    type: PartitionMode
    ways: int
    granularity: int
    size: int
    targets: tuple[RegionTarget, ...]
    uuid: str | None = None

    @property
    def dpa_size(self) -> int:
        """Bytes each memdev gives the region."""
        return self.size // self.ways


def layout_region(topo: CxlTopology, req: RegionRequest) -> RegionLayout:
    """Decide and validate a region; raises InvalidRequestError / NotFoundError."""
    topo.require()
    ways = req.ways if req.ways is not None else (len(req.memdevs) or 1)
    _check_ways(ways)
    if req.granularity is not None:
        _check_granularity_value(req.granularity)
    if req.size is not None:
        _check_size_alignment(req.size, ways)
    memdevs = _resolve_memdevs(topo, req.memdevs)
    if memdevs and len(memdevs) != ways:
        raise InvalidRequestError(
            f"{len(memdevs)} memdev(s) named for a {ways}-way region; name exactly {ways} "
            f"or change --interleave"
        )
    roots = _candidate_roots(topo, req.decoder, req.bus)
    rtype: PartitionMode = req.type or _default_type(roots, req.decoder)
    _check_uuid(req.uuid, rtype)
    for m in memdevs:
        _check_memdev(m, rtype, req.size // ways if req.size else DPA_ALIGN)

    reasons: list[str] = []
    for root in roots:
        try:
            return _layout_on_root(topo, root, req, rtype, ways, memdevs)
        except InvalidRequestError as e:
            if req.decoder is not None:
                raise
            reasons.append(f"{root.name}: {e}")
    what = ", ".join(m.name for m in memdevs) if memdevs else "free memdevs"
    raise InvalidRequestError(
        f"no root decoder can host a {ways}-way {rtype} region of {what}: " + "; ".join(reasons)
    )


# --- single checks -------------------------------------------------------------------
def _check_ways(ways: int) -> None:
    values.ways(ways)  # the checker the doors share; here for the default (memdev count)


def _check_granularity_value(g: int) -> None:
    if g < MIN_GRANULARITY or g > MAX_GRANULARITY or g & (g - 1):
        raise InvalidRequestError(
            f"interleave granularity {g} is not a power of two from {MIN_GRANULARITY} to "
            f"{MAX_GRANULARITY} bytes"
        )


def _check_size_alignment(size: int, ways: int) -> None:
    unit = DPA_ALIGN * ways
    if size <= 0 or size % unit:
        raise InvalidRequestError(
            f"size {format_size(size)} is not a multiple of 256 MiB x {ways} ways "
            f"({format_size(unit)}); try {format_size(max(unit, size // unit * unit))}"
        )


def _check_uuid(value: str | None, rtype: PartitionMode) -> None:
    if value is None:
        return
    if rtype != PMEM:
        raise InvalidRequestError("--uuid applies to pmem regions only")
    try:  # uuid.UUID also takes other scripts' digits; a UUID is ASCII hex
        uuidlib.UUID(value if value.isascii() else "")
    except ValueError:
        raise InvalidRequestError(f"'{value}' is not a UUID") from None


def _resolve_memdevs(topo: CxlTopology, idents: Sequence[str]) -> list[Memdev]:
    memdevs = [topo.find_memdev(i) for i in idents]
    seen: dict[str, str] = {}
    for ident, m in zip(idents, memdevs, strict=True):
        if m.name in seen:
            raise InvalidRequestError(
                f"memdev {m.name} is named twice ('{seen[m.name]}' and '{ident}'); "
                "each position needs a different memdev"
            )
        seen[m.name] = ident
    return memdevs


def free_capacity(memdev: Memdev, rtype: PartitionMode) -> int:
    """Capacity of that type not yet allocated to any endpoint decoder."""
    total = memdev.partition_size(rtype)
    used = sum(d.dpa_size or 0 for d in memdev.decoders if d.mode == rtype)
    return max(0, total - used)


def next_free_decoder(memdev: Memdev) -> Decoder | None:
    """The endpoint decoder the kernel will accept next: DPA is allocated in decoder-id
    order, so it is the one after the last decoder holding an allocation."""
    decoders = sorted(memdev.decoders, key=lambda d: _natural_key(d.name))
    used = [i for i, d in enumerate(decoders) if (d.dpa_size or 0) > 0 or d.region or d.size]
    nxt = (used[-1] + 1) if used else 0
    if nxt >= len(decoders) or decoders[nxt].locked:
        return None
    return decoders[nxt]


def _check_memdev(m: Memdev, rtype: PartitionMode, needed: int) -> None:
    if not m.enabled or m.endpoint is None:
        raise InvalidRequestError(
            f"memdev {m.name} is disabled (no driver or no endpoint port); enable it first "
            f"(cxl enable-memdev {m.name})"
        )
    free = free_capacity(m, rtype)
    if free < needed:
        mapped = ", ".join(r.name for r in m.regions)
        held = f" (already mapped by {mapped})" if mapped else ""
        raise InvalidRequestError(
            f"memdev {m.name} has {format_size(free)} of free {rtype} capacity{held}; "
            f"{format_size(needed)} is needed"
        )
    if next_free_decoder(m) is None:
        raise InvalidRequestError(
            f"memdev {m.name} has no free endpoint decoder (all of "
            f"{', '.join(d.name for d in m.decoders)} are in use)"
        )


def _candidate_roots(topo: CxlTopology, name: str | None, bus: str | None) -> list[Decoder]:
    roots = topo.root_decoders()
    if bus is not None:
        b = next((b for b in topo.buses if bus in (b.name, b.provider, b.name[4:])), None)
        if b is None:
            raise NotFoundError("bus", bus, [b.name for b in topo.buses])
        roots = [d for d in roots if d.port == b.port]
    if name is None:
        if not roots:
            where = f" on {bus}" if bus else ""
            raise InvalidRequestError(f"no root decoder (CXL window){where} on this system")
        return roots
    dec = next((d for d in topo.decoders if d.name == name), None)
    if dec is None or (dec.kind == "root" and dec not in roots):
        raise NotFoundError("root decoder", name, [d.name for d in roots])
    if dec.kind != "root":
        raise InvalidRequestError(
            f"{name} is {'an' if dec.kind == 'endpoint' else 'a'} {dec.kind} decoder of "
            f"{dec.port}, not a root decoder; name one of: " + ", ".join(d.name for d in roots)
        )
    return [dec]


def _default_type(roots: Sequence[Decoder], named: str | None) -> PartitionMode:
    if named is not None and not roots[0].can_map(RAM) and roots[0].can_map(PMEM):
        return PMEM
    return RAM


# --- one root decoder ----------------------------------------------------------------
def _layout_on_root(
    topo: CxlTopology,
    root: Decoder,
    req: RegionRequest,
    rtype: PartitionMode,
    ways: int,
    memdevs: list[Memdev],
) -> RegionLayout:
    if not root.can_map(rtype):
        raise InvalidRequestError(f"root decoder {root.name} cannot map {rtype} memory")
    root_ways = root.interleave_ways or 1
    if ways % root_ways:
        raise InvalidRequestError(
            f"{root.name} interleaves {root_ways} host bridges; region ways must be a "
            f"multiple of {root_ways}"
        )
    granularity = _granularity(root, req.granularity)
    if memdevs:
        ordered = order_by_position(root, memdevs)
    else:
        ordered = _pick_memdevs(topo, root, rtype, ways, req.size)
    _check_port_decoders(ordered)
    _check_address_order(root, ordered)
    size = _size(root, ordered, rtype, ways, req.size)
    targets = tuple(
        RegionTarget(position=i, memdev=m, decoder=_must(next_free_decoder(m)))
        for i, m in enumerate(ordered)
    )
    region_uuid = req.uuid or (str(uuidlib.uuid4()) if rtype == PMEM else None)
    return RegionLayout(root, rtype, ways, granularity, size, targets, region_uuid)


def _must(d: Decoder | None) -> Decoder:
    assert d is not None  # checked by _check_memdev / _usable
    return d


def _granularity(root: Decoder, asked: int | None) -> int:
    root_g = root.interleave_granularity or 4096
    if asked is None:
        return root_g
    if (root.interleave_ways or 1) > 1 and asked != root_g:
        raise InvalidRequestError(
            f"{root.name} interleaves host bridges at {root_g} bytes; the region's "
            f"granularity must be {root_g} (asked {asked})"
        )
    return asked


def order_by_position(root: Decoder, memdevs: Sequence[Memdev]) -> list[Memdev]:
    """The memdevs in the interleave-position order the decode path requires."""
    routes: dict[str, list[str]] = {}
    targets = [d.name for d in root.targets]
    for m in memdevs:
        ep = m.endpoint
        hops = [dport for _port, dport in ep.route] if ep else []
        if not hops or hops[0] not in targets:
            where = f"host bridge {hops[0]}" if hops else "no known host bridge"
            if hops and m.numa_node is not None:
                where += f" (node {m.numa_node})"
            sockets = sorted({x.numa_node for x in memdevs if x.numa_node is not None})
            across = (
                f"; memdevs on two sockets (nodes {', '.join(map(str, sockets))}) need a window "
                "that interleaves their host bridges"
                if len(sockets) > 1
                else ""
            )
            raise InvalidRequestError(
                f"memdev {m.name} sits under {where}, which root decoder {root.name} does "
                f"not reach (it targets {', '.join(targets) or 'nothing'}){across}"
            )
        routes[m.name] = hops
    return _interleave(list(memdevs), routes, 0, targets, root.name)


def _interleave(
    memdevs: list[Memdev],
    routes: dict[str, list[str]],
    level: int,
    order: list[str] | None,
    where: str,
) -> list[Memdev]:
    if len(memdevs) == 1 and order is None:
        return memdevs
    groups: dict[str, list[Memdev]] = {}
    for m in memdevs:
        hops = routes[m.name]
        if level >= len(hops):
            raise InvalidRequestError(
                f"memdevs {', '.join(x.name for x in memdevs)} share one path below {where}; "
                "they cannot be interleaved with each other"
            )
        groups.setdefault(hops[level], []).append(m)
    keys = order if order is not None else sorted(groups, key=_natural_key)
    missing = [k for k in keys if k not in groups]
    if missing:
        raise InvalidRequestError(
            f"{where} interleaves {', '.join(keys)}; every one needs memdevs, none sit "
            f"under {', '.join(missing)}"
        )
    counts = {k: len(g) for k, g in groups.items()}
    if len(set(counts.values())) != 1:
        spread = ", ".join(f"{n} under {k}" for k, n in counts.items())
        raise InvalidRequestError(
            f"memdevs are spread unevenly below {where} ({spread}); each branch of an "
            "interleave needs the same number"
        )
    sub = [_interleave(groups[k], routes, level + 1, None, k) for k in keys]
    n = len(keys)
    return [sub[p % n][p // n] for p in range(n * len(sub[0]))]


def _usable(m: Memdev, rtype: PartitionMode, needed: int) -> bool:
    return (
        m.enabled
        and m.endpoint is not None
        and free_capacity(m, rtype) >= needed
        and next_free_decoder(m) is not None
    )


def _pick_memdevs(
    topo: CxlTopology, root: Decoder, rtype: PartitionMode, ways: int, size: int | None
) -> list[Memdev]:
    """The first set of ``ways`` usable memdevs (largest free capacity first) that the
    root decoder can interleave."""
    needed = size // ways if size else DPA_ALIGN
    usable = [m for m in topo.memdevs if _usable(m, rtype, needed)]
    usable.sort(key=lambda m: (-free_capacity(m, rtype), _natural_key(m.name)))
    for combo in itertools.combinations(usable, ways):
        try:
            ordered = order_by_position(root, combo)
            _check_port_decoders(ordered)
            _check_address_order(root, ordered)
            return ordered
        except InvalidRequestError:
            continue
    if len(usable) < ways:
        busy = [f"{m.name} ({_why_unusable(m, rtype)})" for m in topo.memdevs if m not in usable]
        raise InvalidRequestError(
            f"{len(usable)} memdev(s) have {format_size(needed)} of free {rtype} capacity "
            f"and a free decoder, {ways} needed; not usable: {', '.join(busy) or 'none'}"
        )
    raise InvalidRequestError(
        f"no {ways} of the usable memdevs ({', '.join(m.name for m in usable)}) can be "
        "interleaved under it"
    )


def _why_unusable(m: Memdev, rtype: PartitionMode) -> str:
    if not m.enabled or m.endpoint is None:
        return "disabled"
    if next_free_decoder(m) is None:
        return "no free decoder"
    regions = ", ".join(r.name for r in m.regions)
    return f"{format_size(free_capacity(m, rtype))} free" + (f", in {regions}" if regions else "")


def _check_port_decoders(memdevs: Sequence[Memdev]) -> None:
    """Every host bridge or switch on the way needs a free decoder for the region."""
    ports = {}
    for m in memdevs:
        ep = m.endpoint
        for port, _dport in ep.route if ep else []:
            if port.kind != "root":
                ports[port.name] = port
    for port in ports.values():
        if not any(not d.committed and not d.locked and not d.region for d in port.decoders):
            raise InvalidRequestError(
                f"port {port.name} ({port.host}) has no free decoder for another region"
            )


def _check_address_order(root: Decoder, memdevs: Sequence[Memdev]) -> None:
    """The kernel takes a port's decoders in address order: a region cannot join a port
    (host bridge, switch or endpoint) that already decodes a region above this window
    (the kernel's "HPA order violation", EBUSY). On two sockets that happens when a
    window over both host bridges holds a region and a window of one bridge, lower in
    the address map, is asked for another."""
    if root.resource is None:
        return
    window_end = root.resource + root.size
    seen: set[str] = set()
    for m in memdevs:
        ep = m.endpoint
        ports = [port for port, _dport in ep.route if port.kind != "root"] if ep else []
        for port in [*ports, *([ep] if ep else [])]:
            if port.name in seen:
                continue
            seen.add(port.name)
            for d in port.decoders:
                if d.region and d.committed and d.resource is not None and d.resource >= window_end:
                    raise InvalidRequestError(
                        f"{port.name} ({port.host}) already decodes {d.region} at "
                        f"{d.resource:#x}, above {root.name}'s window ({root.resource:#x}); the "
                        f"kernel takes a port's decoders in address order: destroy {d.region} "
                        "first, or use a window above it"
                    )


def _size(
    root: Decoder, memdevs: Sequence[Memdev], rtype: PartitionMode, ways: int, asked: int | None
) -> int:
    unit = DPA_ALIGN * ways
    extent = root.max_available_extent or 0
    room = extent // unit * unit
    if asked is not None:
        if asked > extent:
            raise InvalidRequestError(
                f"{format_size(asked)} does not fit in {root.name}: "
                f"{format_size(extent)} of its window is free"
            )
        return asked
    per_device = min(free_capacity(m, rtype) for m in memdevs) // DPA_ALIGN * DPA_ALIGN
    size = min(per_device * ways, room)
    if size == 0:
        raise InvalidRequestError(
            f"no room: the smallest memdev has {format_size(per_device)} free and "
            f"{root.name} has {format_size(extent)} of window free"
        )
    return size
