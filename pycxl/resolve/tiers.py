"""One name space for memory targets and initiators: dram0, cxl0, gpu0, node3, cpu5.

dramN: nodes with CPUs, in node-id order. cxlN: nodes fed by a CXL region's dax device
(or named explicitly as CXL, for study on machines without CXL), in node-id order.
gpuN: CUDA devices in PCI bus order. nodeN: any NUMA node. cpuN: one CPU (initiator).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, get_args

from ..base.errors import InvalidRequestError, NotFoundError
from ..base.values import ascii_digits, is_digits, list_items
from ..gpu.inventory import GpuDevice
from ..numa.nodes import NumaNode

if TYPE_CHECKING:
    from ..measure.targets import Target

Tier = Literal["dram", "cxl", "cpuless"]
# How a node's nearest CPU node is known: it has CPUs itself; its memdevs' host bridges
# all sit on one socket; or the firmware's distances (SLIT) single one out
NearBy = Literal["self", "memdevs", "distance"]
NameKind = Literal["dram", "cxl", "gpu", "node", "cpu"]
NAME_KINDS: tuple[NameKind, ...] = get_args(NameKind)
TokenKind = NameKind | Literal["all", "id", "range", "other"]
# the one pattern for names: leading letters, then the rest (a number, a list of ids)
_TOKEN_RE = re.compile(r"^([a-z]*)(.*)$", re.DOTALL)
EXPLICIT_CXL_ENV = "PYCXL_CXL_NODES"


@dataclass(frozen=True)
class NodeTier:
    """A NUMA node with its tier and its tier name (dram0, cxl0, or node<N> otherwise)."""

    node: NumaNode
    tier: Tier
    name: str
    region: str | None = None  # the CXL region feeding it
    explicit: bool = False  # mapped to CXL by the user, not by the topology
    zone: str | None = None  # CXL memory's zone: movable, normal or mixed
    # the nodes (sockets) its CXL memdevs hang off, through their host bridges
    memdev_nodes: tuple[int, ...] = ()
    near: int | None = None  # the node with CPUs nearest it (itself, if it has CPUs)
    near_by: NearBy | None = None  # how ``near`` was decided

    @property
    def holds_longterm_pins(self) -> bool | None:
        """Whether long-term pins (GPU registration) keep their pages on this node:
        True in ZONE_NORMAL, False in ZONE_MOVABLE (the kernel moves them to another
        node), None where it is mixed or the zone is not known (nodes with CPUs have
        normal memory of their own)."""
        if self.zone is None:
            return True if self.node.cpus else None
        from ..cxl.memory_blocks import HOLDS_LONGTERM_PINS

        return HOLDS_LONGTERM_PINS[self.zone]


@dataclass(frozen=True)
class Token:
    """One name as typed, parsed once: its leading letters and what follows them.
    ``dram0`` is ('dram', '0'), ``cpu0-3`` ('cpu', '0-3'), ``0-2`` ('', '0-2'), ``all``
    ('all', ''); ``kind`` says what it names."""

    text: str  # without surrounding blanks (names are case-sensitive, as numactl's)
    prefix: str
    ids: str
    typed: str = field(default="", compare=False)  # as given, for messages

    def __str__(self) -> str:
        return self.typed or self.text

    @property
    def kind(self) -> TokenKind:
        """A named thing (dram, cxl, gpu, node, cpu: a prefix and one number), ``all``,
        ``id`` (a bare number: that node), ``range`` (a list of ids such as 0-2), or
        ``other`` (resolves to nothing)."""
        if self.text == "all":
            return "all"
        if is_digits(self.ids):
            if self.prefix in NAME_KINDS:
                return self.prefix
            if not self.prefix:
                return "id"
        if not self.prefix and "-" in self.ids and is_digits(self.ids[:1]):
            return "range"
        return "other"

    @property
    def number(self) -> int:
        """The number of a named thing or a bare id (gpu1 -> 1)."""
        return int(self.ids)

    @property
    def is_gpu(self) -> bool:
        """Whether it names a GPU (gpu0), without asking the driver."""
        return self.kind == "gpu"

    @property
    def cpu_list(self) -> str:
        """A CPU list, after its optional ``cpu`` prefix (cpu0-3 -> 0-3)."""
        return self.text[3:] if self.text.startswith("cpu") else self.text

    @property
    def id_list(self) -> str | None:
        """The ids of a node or CPU list where it is one (``0-2``, ``3``, ``cpu0-3``
        -> '0-2', '3', '0-3'); None for names."""
        if self.prefix in ("", "cpu") and is_digits(self.ids[:1]):
            return self.ids
        return None


# an example of a kind of name, and of a list of them, for a message about an empty one
_EXAMPLES = {"GPU": "gpu0", "CPUs": "0-3 or cpu2", "initiator": "dram0 or cpu2"}
_LIST_EXAMPLES = {"GPU": "gpu0,gpu1", "CPUs": "0-3,8 or cpu2", "node": "dram0,cxl0 or 0-1"}


def name_text(name: object, what: str = "target") -> str:
    """A name as typed, checked: a string ('cxl0', 'node1', '0-2') or a node id (int),
    without surrounding blanks. Names are case-sensitive, as numactl's and ndctl's: 'DRAM0'
    names nothing, and is refused (as any unknown name) with the name it resembles."""
    if isinstance(name, bool) or not isinstance(name, str | int):
        raise InvalidRequestError(
            f"{what} {name!r}: give a name such as dram0, cxl0, node1 or gpu0, or a node id"
        )
    text = str(name).strip()
    if not text:
        example = _EXAMPLES.get(what, "dram0")
        raise InvalidRequestError(f"{what}: the name is empty; give one such as {example}")
    ascii_digits(text, what)
    if text != text.lower():  # every name of this grammar is lower case
        raise NotFoundError(what, text, [text.lower()])
    return text


def token(text: str, typed: str = "") -> Token:
    """The grammar: ``text`` (already checked) as a token; ``typed``: as given, whose ids
    (after the letters) messages show as typed."""
    m = _TOKEN_RE.match(text)
    assert m is not None  # the pattern matches any string
    given = typed.strip()
    ids = given[m.end(1) :] if len(given) == len(text) else m.group(2)
    return Token(text, m.group(1), ids, typed)


def parse_name(name: object, what: str = "target") -> Token:
    """One name (or node id), checked and parsed."""
    if isinstance(name, Token):
        return name
    return token(name_text(name, what), str(name))


def is_gpu_name(name: object) -> bool:
    """Whether ``name`` names a GPU (gpu0, gpu1), without asking the driver."""
    if isinstance(name, Token):
        return name.is_gpu
    return isinstance(name, str) and token(name.strip()).is_gpu


def gpu_token(name: object, *, every: bool = True) -> Token:
    """A GPU's name (gpu0), or ``all`` where ``every``, checked without asking the
    driver: a name that is no GPU's is refused before anything is opened."""
    tok = parse_name(name, "GPU")
    if not tok.is_gpu and not (every and tok.kind == "all"):
        also = ", or all" if every else ""
        raise InvalidRequestError(f"'{name}' is not a GPU; name one: gpu0, gpu1...{also}")
    return replace(tok, typed=tok.text)  # messages after this check name it without blanks


def gpu_name(name: object, *, every: bool = True) -> str:
    """``gpu_token``'s name (gpu0, all)."""
    return gpu_token(name, every=every).text


def parse_names(spec: str | int | Iterable[str | int], what: str = "target") -> list[Token]:
    """'dram0,cxl0' or ['0-2', 3] -> their tokens, in order: the one grammar of a list of
    names. An empty item ('dram0,,cxl0', an unset shell variable) is refused, as numactl
    refuses '0,,1'; a name given twice is one name."""
    if isinstance(spec, str | int) or not isinstance(spec, Iterable):
        items: list[object] = [spec]
    else:
        items = list(spec)
    shown = ",".join(map(str, items))
    example = _LIST_EXAMPLES.get(what, "dram0,cxl0")
    if not items:
        raise InvalidRequestError(f"no {what} named: give names such as {example}")
    for i in items:
        if isinstance(i, bool) or not isinstance(i, str | int):
            name_text(i, what)  # refuses it, saying what a name is
    return [token(name_text(p, what)) for p in list_items(shown, what, example)]


def split_names(spec: str | int | Iterable[str | int]) -> list[str]:
    """'dram0,cxl0' or ['0-2', 3] -> ['dram0', 'cxl0'] or ['0-2', '3'], lower case."""
    return [t.text for t in parse_names(spec)]


def explicit_cxl_nodes(value: str | None = None) -> tuple[int, ...]:
    """Nodes the user maps to CXL names (``PYCXL_CXL_NODES=2,3``); never guessed."""
    text = value if value is not None else os.environ.get(EXPLICIT_CXL_ENV, "")
    if not isinstance(text, str):
        raise InvalidRequestError(f"explicit_cxl={text!r}: give NUMA node ids such as '2,3'")
    ids = [x for x in text.replace(" ", "").split(",") if x]
    if not all(is_digits(x) for x in ids):
        raise InvalidRequestError(
            f"{EXPLICIT_CXL_ENV}={text!r}: expected NUMA node ids such as '2,3'"
        )
    return tuple(dict.fromkeys(int(x) for x in ids))


def nearest_cpu_node(
    node: NumaNode, with_cpus: Sequence[NumaNode], memdev_nodes: Sequence[int] = ()
) -> tuple[int | None, NearBy | None]:
    """The node with CPUs nearest ``node``, and how that is known. A CXL node's memory is
    behind host bridges that belong to a socket: when every memdev of it hangs off one
    socket, that is its nearest (the kernel gives CXL nodes one distance to every node).
    Otherwise the smallest distance, if only one node has it; ties go to a socket its
    memdevs hang off, then to the lowest node id."""
    if node.cpus:
        return node.id, "self"
    ids = [n.id for n in with_cpus]
    if len(set(memdev_nodes)) == 1 and memdev_nodes[0] in ids:
        return memdev_nodes[0], "memdevs"
    if not ids:
        return None, None
    best = min(node.distances.get(i, 255) for i in ids)
    tied = [i for i in ids if node.distances.get(i, 255) == best]
    if len(tied) == 1:
        return tied[0], "distance"
    preferred = [i for i in tied if i in memdev_nodes]
    return min(preferred or tied), "distance"


def classify_nodes(
    nodes: Iterable[NumaNode],
    cxl_node_regions: dict[int, str],
    explicit_cxl: Sequence[int] = (),
    zones: dict[int, str] | None = None,
    memdev_nodes: dict[int, tuple[int, ...]] | None = None,
) -> list[NodeTier]:
    """Give each node its tier, its tier name and its nearest node with CPUs."""
    out: list[NodeTier] = []
    counters = {"dram": 0, "cxl": 0}
    nodes = sorted(nodes, key=lambda n: n.id)
    with_cpus = [n for n in nodes if n.cpus]
    _check_explicit(explicit_cxl, nodes, with_cpus)
    for n in nodes:
        region = cxl_node_regions.get(n.id)
        if region is not None or n.id in explicit_cxl:
            tier: Tier = "cxl"
        elif n.cpus:
            tier = "dram"
        else:
            tier = "cpuless"
        if tier == "cpuless":
            name = f"node{n.id}"
        else:
            name = f"{tier}{counters[tier]}"
            counters[tier] += 1
        attached = (memdev_nodes or {}).get(n.id, ())
        near, near_by = nearest_cpu_node(n, with_cpus, attached)
        out.append(
            NodeTier(n, tier, name, region, explicit=region is None and tier == "cxl",
                     zone=(zones or {}).get(n.id), memdev_nodes=attached, near=near,
                     near_by=near_by)
        )  # fmt: skip
    return out


def _check_explicit(explicit: Sequence[int], nodes: Sequence[NumaNode],
                    with_cpus: Sequence[NumaNode]) -> None:  # fmt: skip
    """A node named CXL by hand exists, and at least one node with CPUs stays DRAM (a
    stand-in is a CPU-less or a remote node, never the only socket)."""
    ids = {n.id for n in nodes}
    unknown = [i for i in explicit if i not in ids]
    if unknown:
        raise InvalidRequestError(
            f"{EXPLICIT_CXL_ENV}: node {unknown[0]} does not exist; nodes: "
            + ",".join(map(str, sorted(ids)))
        )
    if with_cpus and all(n.id in explicit for n in with_cpus):
        cpu_nodes = ",".join(str(n.id) for n in with_cpus)
        raise InvalidRequestError(
            f"{EXPLICIT_CXL_ENV} names every node with CPUs ({cpu_nodes}) CXL, leaving no DRAM "
            "tier: name a CPU-less or a remote node, as the usual emulation does"
        )


def resolve(
    name: str | int | Token,
    node_tiers: Sequence[NodeTier],
    gpus: Sequence[GpuDevice] = (),
    *,
    initiator: bool = False,
) -> Target:
    """Resolve a user-typed name (or a node id); an unknown name lists the names that
    exist."""
    from ..measure.targets import Target  # here: `pycxl list` resolves no name

    tok = parse_name(name)
    text, kind = tok.text, tok.kind
    if kind == "cpu":
        if not initiator:
            raise InvalidRequestError(
                f"'{name}' is a CPU: it can start accesses but holds no memory"
            )
        cpu = tok.number
        for nt in node_tiers:
            if cpu in nt.node.cpus:
                return Target(text, "cpu", node=nt.node.id, tier=nt.tier, cpu=cpu)
    elif kind == "gpu":
        for g in gpus:
            if g.target_name == text:
                return Target(text, "gpu", node=g.numa_node, tier="gpu", gpu=g)
    elif kind == "node":
        for nt in node_tiers:
            if nt.node.id == tok.number:
                return Target(text, "node", node=nt.node.id, tier=nt.tier)
    elif kind in ("dram", "cxl"):
        for nt in node_tiers:
            if nt.name == text:
                return Target(text, "node", node=nt.node.id, tier=nt.tier)
    elif kind == "id":
        return resolve(f"node{text}", node_tiers, gpus, initiator=initiator)
    raise NotFoundError("target", str(name), known_names(node_tiers, gpus, initiator=initiator))


def known_names(
    node_tiers: Sequence[NodeTier], gpus: Sequence[GpuDevice] = (), *, initiator: bool = False
) -> list[str]:
    """Every name that resolves here (for error messages)."""
    names = [nt.name for nt in node_tiers if nt.tier != "cpuless"]  # dram0, cxl0
    names += [f"node{nt.node.id}" for nt in node_tiers]
    names += [g.target_name for g in gpus]
    if initiator:
        names += [f"cpu{c}" for nt in node_tiers for c in nt.node.cpus]
    return names
