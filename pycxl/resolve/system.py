"""One snapshot of a host's memory, and the one place that turns names into things.

``System`` holds the CXL objects, the NUMA nodes with their tiers and the GPUs, read
once. Every name a user types (``cxl0``, ``dram0``, ``node3``, ``gpu1``, ``cpu5``, node
lists such as ``0-2,cxl0`` or ``all``) is resolved here, against that one snapshot, into
node ids, CPU ids, GPUs, or pairs of an initiator and the memory it reaches
(``pycxl.measure.targets``). Code below this floor (``cxl``, ``numa``, ``gpu``, ``measure``)
takes what this returns and never resolves names itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal, get_args

from ..base.errors import InvalidRequestError, NotAvailableError, NotFoundError
from ..base.sysfs import Sysfs
from ..base.values import SYSROOT_ENV, IdsBeyond, format_ranges, parse_ranges, word
from ..cxl.read import Backend, read_cxl
from ..gpu.inventory import GpuDevice, GpuInventory, GpuSource
from .tiers import (
    NodeTier,
    Token,
    classify_nodes,
    explicit_cxl_nodes,
    gpu_token,
    parse_name,
    parse_names,
    resolve,
)

if TYPE_CHECKING:  # imported where used: `pycxl list` needs neither
    from ..cxl.topology import CxlTopology
    from ..measure.targets import Pair, Target
    from ..numa.access import AccessFigures
    from ..numa.launch import LaunchSettings


@dataclass(frozen=True, repr=False)
class System:
    """CXL topology, NUMA nodes with tier names, and GPUs, as read at one moment."""

    cxl: CxlTopology
    nodes: tuple[NodeTier, ...]
    # the GPUs as read with the rest; None: read when first needed (``gpus``)
    gpu_inventory: GpuInventory | None = None
    # the tree it was read from ('/': this machine, whose devices can be asked)
    sysroot: str = "/"
    # that tree, opened once, for the calls that read or write it again
    fs: Sysfs | None = field(default=None, repr=False, compare=False)

    def sysfs(self) -> Sysfs:
        """The host tree this system was read from."""
        return self.fs if self.fs is not None else Sysfs(self.sysroot)

    def __repr__(self) -> str:
        cxl = (
            f"{len(self.cxl.memdevs)} memdevs, {len(self.cxl.regions)} regions"
            if self.cxl.present
            else "no CXL"
        )
        nodes = ", ".join(f"{n.name}=node{n.node.id}" for n in self.nodes)
        if self._gpus_read:
            gpus = ", ".join(g.target_name for g in self.gpus.devices) or "no GPU"
        else:
            gpus = "GPUs read when named"
        return f"<System {cxl}; {nodes}; {gpus}>"

    @cached_property
    def gpus(self) -> GpuInventory:
        """The GPUs; a snapshot that left them for later (``gpus='lazy'``) reads them here,
        once: when a GPU name is first resolved, or the inventory is asked for."""
        if self.gpu_inventory is not None:
            return self.gpu_inventory
        from ..gpu.devices import read_gpus

        return read_gpus(self.sysfs(), via="auto")

    @property
    def _gpus_read(self) -> bool:
        return self.gpu_inventory is not None or "gpus" in self.__dict__

    @property
    def absent(self) -> list[str]:
        """What this host lacks, in words, for the summary line."""
        out = []
        if not self.cxl.present:
            out.append(self.cxl.NO_BUS)
        elif not self.cxl.memdevs:
            out.append("no CXL memdevs")
        if self.gpus.absent_reason:
            out.append(self.gpus.absent_reason)
        return out

    @property
    def recorded(self) -> bool:
        """Read from a recorded tree (--sysroot, PYCXL_SYSROOT), not this machine."""
        return self.sysroot != "/"

    def require_live(self, doing: str) -> None:
        """A recorded tree is only read: measuring, binding, placing or running on its
        names would act on this machine's nodes and CPUs under another's names."""
        if self.recorded:
            raise InvalidRequestError(
                f"{doing} needs this machine, but the system was read from the recorded "
                f"tree {self.sysroot} (--sysroot or {SYSROOT_ENV}); a recorded tree is only "
                f"read: leave it unset"
            )

    def placement_nodes(self, spec: str | int | Iterable[str | int]) -> tuple[int, ...]:
        """``memory_nodes`` of this machine, to put memory on (never of a recorded tree)."""
        self.require_live(f"placing memory on {spec}")
        return self.memory_nodes(spec)

    # --- single names ----------------------------------------------------------------
    def resolve(self, name: str | int | Token, *, initiator: bool = False) -> Target:
        """What ``name`` stands for; NotFoundError lists the names that exist (GPUs where
        they have been read: a GPU name reads them)."""
        tok = parse_name(name)
        gpus = self.gpus.devices if tok.is_gpu or self._gpus_read else ()
        return resolve(tok, self.nodes, gpus, initiator=initiator)

    def tier(self, node: int) -> NodeTier | None:
        """The tier entry of NUMA node ``node``."""
        return next((t for t in self.nodes if t.node.id == node), None)

    def tier_name(self, node: int | None) -> str | None:
        """'cxl0' for the node fed by the first CXL region, and so on; None if unknown."""
        t = self.tier(node) if node is not None else None
        return t.name if t else None

    def gpu(self, name: str | Token) -> GpuDevice:
        """A GPU by name (gpu0): a name that is no GPU's is refused first, one that no
        GPU on the bus has is NotFoundError, and NotAvailableError says there is no
        driver to reach one that is there."""
        tok = gpu_token(name, every=False)
        self.require_gpus(tok)
        t = self.resolve(tok)
        assert t.gpu is not None
        return t.gpu

    def gpus_named(self, name: str) -> tuple[GpuDevice, ...]:
        """``all`` for every GPU, or one GPU by name."""
        tok = gpu_token(name)
        if tok.kind == "all":
            return self.require_gpus()
        return (self.gpu(tok),)

    def require_gpus(self, name: str | Token | None = None) -> tuple[GpuDevice, ...]:
        """Every GPU; NotAvailableError without a driver or a GPU. Where the driver
        shows none, a GPU ``name`` whose index is past the NVIDIA GPUs on the PCI bus
        names nothing that exists (NotFoundError), whatever the driver."""
        if self.gpus.devices:
            return self.gpus.devices
        tok = parse_name(name) if name is not None else None
        if tok is not None and tok.is_gpu:
            from ..pci.devices import nvidia_gpus

            on_bus = nvidia_gpus(self.sysfs())
            if tok.number >= len(on_bus):
                raise NotFoundError(
                    "GPU", str(tok), [f"gpu{i}" for i in range(len(on_bus))],
                    problem=f"the PCI bus shows {len(on_bus)} NVIDIA GPU"
                    f"{'' if len(on_bus) == 1 else 's'}",
                )  # fmt: skip
        raise NotAvailableError(self.gpus.absent_reason or "no GPU")

    # --- lists of names ---------------------------------------------------------------
    def memory_nodes(self, spec: str | int | Iterable[str | int]) -> tuple[int, ...]:
        """Nodes with memory, from names, ids, ranges (``0-2``) or ``all``, in order given."""
        out: list[int] = []
        for tok in parse_names(spec):
            item = tok.text
            if tok.kind == "all":
                ids = [t.node.id for t in self.nodes if t.node.has_memory]
            else:
                ids = self._node_ids(tok, initiator=False)
            for node in ids:
                t = self.tier(node)
                if t is None or not t.node.has_memory:
                    raise InvalidRequestError(
                        f"{item} (node {node}) has no memory online; online it first "
                        "(pycxl region enable REGION)"
                    )
                if node not in out:
                    out.append(node)
        return tuple(out)

    def cpu_nodes(self, spec: str | int | Iterable[str | int]) -> tuple[int, ...]:
        """Nodes with CPUs, from names, ids, ranges or ``all``."""
        out: list[int] = []
        for tok in parse_names(spec):
            item = tok.text
            ids = (
                [t.node.id for t in self.nodes if t.node.cpus]
                if tok.kind == "all"
                else self._node_ids(tok, initiator=True)
            )
            for node in ids:
                t = self.tier(node)
                if t is None or not t.node.cpus:
                    raise InvalidRequestError(f"{item} (node {node}) has no CPUs")
                if node not in out:
                    out.append(node)
        return tuple(out)

    def cpus(self, spec: str | int | Iterable[str | int]) -> tuple[int, ...]:
        """CPU ids from a CPU list (``0-3,8``), ``cpuN`` names or ``all`` (every online
        CPU); each must exist."""
        online = sorted(c for t in self.nodes for c in t.node.cpus)
        out: list[int] = []
        for tok in parse_names(spec, "CPUs"):
            item = tok.text
            if tok.kind == "all":
                ids = online
            else:
                text = tok.cpu_list
                if not text.strip():
                    raise InvalidRequestError(
                        f"CPU '{item}' names no CPU: give ids such as cpu3, 0-3,8 or all"
                    )
                try:
                    ids = list(parse_ranges(text, limit=max(online, default=-1) + 1))
                except IdsBeyond as e:
                    which = f"CPU {e} is" if str(e).isdecimal() else f"CPUs {e} are"
                    raise InvalidRequestError(
                        f"{which} not online; online CPUs: {format_ranges(online)}"
                    ) from None
                except ValueError as e:
                    raise InvalidRequestError(
                        f"CPU list '{item}': {e} (use numbers and ranges such as 0-3,8)"
                    ) from None
            missing = [c for c in ids if c not in online]
            if missing:
                raise InvalidRequestError(
                    f"CPU {missing[0]} is not online; online CPUs: {format_ranges(online)}"
                )
            out += [c for c in ids if c not in out]
        return tuple(out)

    def _node_ids(self, tok: Token, *, initiator: bool) -> list[int]:
        item = tok.text
        if tok.kind == "range":  # a range of node ids: 0-2
            known = {t.node.id for t in self.nodes}
            try:  # bounded by the ids that exist before it is expanded
                ids = list(parse_ranges(item, limit=max(known, default=-1) + 1))
                gone = format_ranges(i for i in ids if i not in known)
            except IdsBeyond as e:
                gone = str(e)
            except ValueError as e:
                raise InvalidRequestError(f"node range {e}") from None
            if gone:
                one = gone.isdecimal()
                raise NotFoundError(
                    "NUMA node range", item, [str(k) for k in sorted(known)],
                    problem=f"node{'' if one else 's'} {gone} do{'es' if one else ''} not exist",
                )  # fmt: skip
            return ids
        t = self.resolve(tok, initiator=initiator)
        if t.kind == "gpu":
            raise InvalidRequestError(f"'{item}' is a GPU: its memory is not a NUMA node")
        assert t.node is not None
        return [t.node]

    # --- what operations take ---------------------------------------------------------
    def pair(self, target: str | Token, initiator: str | Token | None = None) -> Pair:
        """``target``'s memory and who reaches it, resolved once: host memory from
        ``initiator``'s CPUs (a node with CPUs, or one CPU; by default those of the node
        with CPUs nearest the target) or from a GPU; or a GPU's own memory, from itself."""
        from ..measure.targets import Pair, Target

        to = parse_name(target)
        by = parse_name(initiator, "initiator") if initiator is not None else None
        if to.is_gpu and by is not None and not by.is_gpu:
            raise InvalidRequestError(
                f"{initiator} cannot load from GPU memory: measure {target} from itself "
                f"(--target {target}) or host memory from it (--from {target} --target dram0)"
            )
        for tok in (to, by):  # no driver or no GPU says so, before 'unknown gpu0'
            if tok is not None and tok.is_gpu:
                self.require_gpus(tok)
        t = self.resolve(to)
        i = self.resolve(by, initiator=True) if by is not None else None
        if t.is_gpu:
            if i is not None and i.gpu != t.gpu:
                raise InvalidRequestError(
                    f"{initiator} is not measured against another GPU's memory ({target}): "
                    f"use --target {initiator}, or a host tier with --from {initiator}"
                )
            return Pair(t, t)
        assert t.node is not None
        node = self._tier(t.node).node
        if not node.has_memory:
            raise InvalidRequestError(f"{target} (node {node.id}) has no memory online")
        if i is None or i.is_gpu:
            near = self.nearest_cpu_node(node.id)
            who = i or Target(near.name, "node", node=near.node.id, tier=near.tier)
            return Pair(t, who, near.node.cpus, node.mem_available)
        if i.kind == "cpu" and i.cpu is not None:
            cpus: tuple[int, ...] = (i.cpu,)
        elif i.kind == "node" and i.node is not None and self._tier(i.node).node.cpus:
            cpus = self._tier(i.node).node.cpus
        else:
            raise InvalidRequestError(f"initiator '{initiator}' has no CPUs")
        allowed = os.sched_getaffinity(0)
        cpus = tuple(c for c in cpus if c in allowed)
        if not cpus:
            raise InvalidRequestError(f"initiator '{initiator}': none of its CPUs is allowed here")
        return Pair(t, i, cpus, node.mem_available)

    def host_pair(self, target: str | Token, initiator: str | Token | None = None, *,
                  instead: str) -> Pair:  # fmt: skip
        """As ``pair``, where only host memory can be measured: a GPU's memory is refused
        first (also where no GPU can be read), saying what measures it ``instead``."""
        to = parse_name(target)
        if to.is_gpu:
            raise InvalidRequestError(f"{target} is GPU memory: {instead}")
        return self.pair(to, initiator)

    def nearest_cpu_node(self, node: int) -> NodeTier:
        """The node with CPUs nearest ``node``: itself, if it has CPUs; for a CXL node,
        the socket its memdevs hang off; else by distance (tiers.nearest_cpu_node)."""
        near = self._tier(node).near
        if near is None:
            raise NotAvailableError("no NUMA node has CPUs")
        return self._tier(near)

    def advertised(self, node: int, cpus: Sequence[int]) -> AccessFigures | None:
        """What the platform advertises for ``cpus`` reaching ``node`` (HMAT; CDAT for
        CXL): the node's CPU figures, when every one of the CPUs is on a node they are
        for. The kernel names those nodes for DRAM; for a CXL node it names none, and
        its figures are for the best initiator, the socket its host bridges sit on."""
        t = self._tier(node)
        figures = t.node.advertised
        if figures is None or not cpus:
            return None
        for_nodes = set(figures.initiators) or ({t.near} if t.near is not None else set())
        cpu_nodes = {n.node.id for n in self.nodes for c in cpus if c in n.node.cpus}
        return figures if cpu_nodes and cpu_nodes <= for_nodes else None

    def near_tiers(self, node: int) -> list[NodeTier]:
        """The nodes with memory whose nearest CPU node is ``node``'s: its socket's DRAM
        and CXL tiers (for a GPU, pass its nearest node)."""
        near = self.nearest_cpu_node(node).node.id
        return [t for t in self.nodes if t.near == near and t.node.has_memory]

    def copy_cpus(self, gpu: GpuDevice, limit: int) -> tuple[int, ...]:
        """Up to ``limit`` CPUs of the GPU's nearest node that this process may use."""
        allowed = os.sched_getaffinity(0)
        t = self.tier(gpu.numa_node) if gpu.numa_node is not None else None
        return tuple([c for c in t.node.cpus if c in allowed][:limit]) if t else ()

    def launch_settings(
        self,
        *,
        membind: Sequence[str] = (),
        preferred: str | None = None,
        preferred_many: Sequence[str] = (),
        interleave: Sequence[str] = (),
        weighted_interleave: Sequence[str] = (),
        localalloc: bool = False,
        cpunodebind: Sequence[str] = (),
        physcpubind: Sequence[str] = (),
    ) -> LaunchSettings:
        """A memory policy and CPU set from numactl-style choices, validated."""
        from ..numa.launch import LaunchSettings
        from ..numa.policy import Policy

        chosen = [
            bool(membind), preferred is not None, bool(preferred_many), bool(interleave),
            bool(weighted_interleave), bool(localalloc),
        ]  # fmt: skip
        if sum(chosen) > 1:
            raise InvalidRequestError(
                "choose one memory policy: --membind, --preferred, --preferred-many, "
                "--interleave, --weighted-interleave or --localalloc"
            )
        if cpunodebind and physcpubind:
            raise InvalidRequestError("choose one of --cpunodebind and --physcpubind")
        policy: Policy | None = None
        if membind:
            policy = Policy.bind(*self.memory_nodes(membind))
        elif preferred is not None:
            nodes = self.memory_nodes(preferred)
            if len(nodes) != 1:
                raise InvalidRequestError(
                    f"--preferred takes one node, not {len(nodes)}; use --preferred-many"
                )
            policy = Policy.preferred(nodes[0])
        elif preferred_many:
            policy = Policy.preferred_many(*self.memory_nodes(preferred_many))
        elif interleave:
            policy = Policy.interleave(*self.memory_nodes(interleave))
        elif weighted_interleave:
            policy = Policy.weighted_interleave(*self.memory_nodes(weighted_interleave))
        elif localalloc:
            policy = Policy.local()
        cpus: tuple[int, ...] = ()
        if cpunodebind:
            cpus = tuple(c for n in self.cpu_nodes(cpunodebind) for c in self._tier(n).node.cpus)
        elif physcpubind:
            cpus = self.cpus(physcpubind)
        return LaunchSettings(policy, cpus)

    def _tier(self, node: int) -> NodeTier:
        t = self.tier(node)
        if t is None:
            raise NotFoundError("NUMA node", str(node), [str(n.node.id) for n in self.nodes])
        return t


def snapshot(
    sysroot: str | Sysfs | None = None,
    *,
    backend: Backend = "sysfs",
    gpus: bool | GpuSource | Literal["lazy"] = True,
    explicit_cxl: str | None = None,
    cxl: CxlTopology | None = None,
) -> System:
    """Read everything once. ``gpus=False`` skips the GPUs; True reads them without
    starting CUDA where the driver allows, a source name ('nvml', 'files', 'cuda') as
    ``pycxl.gpu.read_gpus`` says; 'lazy' reads them (as True) when a GPU name is first
    resolved, so a command that names none never asks the driver; ``explicit_cxl``
    ('2,3') names nodes CXL on a machine without CXL (default: ``PYCXL_CXL_NODES``);
    ``cxl``: the CXL objects as just read (a region operation's read-back), instead of
    reading them again."""
    from ..gpu.devices import read_gpus
    from ..gpu.nvml_session import begin_reading
    from ..numa.nodes import read_nodes

    fs = sysroot if isinstance(sysroot, Sysfs) else Sysfs(sysroot)
    if not isinstance(gpus, bool):
        word(gpus, "gpus", (*get_args(GpuSource), "lazy"))
    lazy = gpus == "lazy"
    via: GpuSource | None = (
        None if gpus is False or gpus == "lazy" else "auto" if gpus is True else gpus
    )
    if via is not None:
        begin_reading(fs, via)  # the driver's start overlaps reading CXL and the nodes
    if cxl is None:
        cxl = read_cxl(fs, backend)
    else:
        from ..cxl.topology import CxlTopology

        if not isinstance(cxl, CxlTopology):
            raise InvalidRequestError(f"cxl={cxl!r}: give a CxlTopology (pycxl.read_cxl)")
    nodes = classify_nodes(
        read_nodes(fs), cxl.node_to_region(), explicit_cxl_nodes(explicit_cxl), cxl.node_zones(),
        cxl.node_memdev_nodes(),
    )  # fmt: skip
    if lazy:
        inventory = None
    elif via is None:
        inventory = GpuInventory((), None, "GPUs not queried")
    else:
        inventory = read_gpus(fs, via=via)
    return System(cxl=cxl, nodes=tuple(nodes), gpu_inventory=inventory, sysroot=fs.root, fs=fs)


def given_or_read(system: object, *, gpus: bool | GpuSource | Literal["lazy"] = True) -> System:
    """The ``system=`` a library call was given, checked, or a snapshot read now."""
    if system is None:
        return snapshot(gpus=gpus)
    if not isinstance(system, System):
        raise InvalidRequestError(f"system={system!r}: give a System (pycxl.snapshot()) or None")
    return system
