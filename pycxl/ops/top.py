"""``pycxl top``: live traffic per GPU link and per memory tier, as ``nvidia-smi dmon``
(PCIe per GPU), ``pcm-memory`` (memory bandwidth per socket and CXL device) and numastat
(page traffic per node) show it, in one report per interval.

Each source is opened once (``pycxl.counters``); each report holds the rates between
two reads, every figure beside the bandwidth of the link or memory it is on (its
*ceiling*) where that is known, and, for each figure this host does not have, the reason
in words. With ``pid``, the process's resident pages per tier and how they change.
"""

from __future__ import annotations

import datetime
import os
import select
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import NotFoundError
from ..base.jsontype import Json
from ..base.sysfs import Sysfs
from ..base.values import count as whole_count, finite, pid as check_pid
from ..counters import memory_pmus, page_traffic, resctrl
from ..counters.base import (
    ALLOC,
    C2C_RX,
    C2C_TX,
    DEMOTED,
    HBM_BUSY,
    LOCAL,
    MBM_LOCAL,
    MBM_TOTAL,
    MEM_READ,
    MEM_WRITE,
    NVLINK_RX,
    NVLINK_TX,
    PCIE_RX,
    PCIE_TX,
    PROMOTED,
    REMOTE,
    Key,
    Missing,
    Reader,
    Reading,
    Subject,
    per_second,
)
from ..gpu.inventory import GpuDevice
from ..pci.link import read_link
from ..resolve.system import System, snapshot

# figure -> its key in JSON (bytes per second unless the name says otherwise)
GPU_FIGURES = {
    PCIE_RX: "pcie_rx_bytes_per_s",
    PCIE_TX: "pcie_tx_bytes_per_s",
    NVLINK_RX: "nvlink_rx_bytes_per_s",
    NVLINK_TX: "nvlink_tx_bytes_per_s",
    C2C_RX: "c2c_rx_bytes_per_s",
    C2C_TX: "c2c_tx_bytes_per_s",
    HBM_BUSY: "hbm_busy_ratio",
}
NODE_FIGURES = {
    MEM_READ: "read_bytes_per_s",
    MEM_WRITE: "write_bytes_per_s",
    MBM_LOCAL: "mbm_local_bytes_per_s",
    MBM_TOTAL: "mbm_total_bytes_per_s",
    ALLOC: "allocations_per_s",
    LOCAL: "local_allocations_per_s",
    REMOTE: "remote_allocations_per_s",
    PROMOTED: "promoted_pages_per_s",
    DEMOTED: "demoted_pages_per_s",
}
# a GPU's links: the figures on each, both directions
GPU_LINKS = {"pcie": (PCIE_RX, PCIE_TX), "nvlink": (NVLINK_RX, NVLINK_TX), "c2c": (C2C_RX, C2C_TX)}
LINK_MAXIMA = {"nvlink": "nvlink_max", "c2c": "c2c_max"}  # NVML's, in the readings' rates
NOT_COUNTED = Missing("no-counter", "pycxl counts the memory traffic of CPU sockets' memory "
                      "controllers and of CXL devices; this node is neither")  # fmt: skip


@dataclass(frozen=True)
class Ceiling:
    """What a link or a memory can carry, in bytes per second: per direction for a
    link (``duplex``: reads and writes each have it), in all for a memory bus."""

    bytes_per_s: float
    basis: str  # how it was found: 'PCIe 32GT/s x16', 'HMAT', '2 memdevs' PCIe links'
    duplex: bool = True

    def share(self, one_way: Sequence[float | None]) -> float | None:
        """The busiest direction's share of a duplex link, or the sum's of a bus."""
        known = [v for v in one_way if v is not None]
        if not known or self.bytes_per_s <= 0:
            return None
        return (max(known) if self.duplex else sum(known)) / self.bytes_per_s


@dataclass(frozen=True)
class Row:
    """One GPU or NUMA node in a report: its figures per second (``hbm_busy`` a ratio),
    why the missing ones are missing, its ceilings by link ('pcie', 'nvlink', 'c2c' for
    a GPU, 'memory' for a node), its counters' totals so far, and how they were read."""

    kind: str  # 'gpu' or 'node'
    name: str  # gpu0, dram0, cxl0, node3
    id: int  # GPU index or node id
    tier: str  # gpu, dram, cxl, cpuless
    figures: Mapping[str, float] = field(default_factory=dict, hash=False)
    missing: Mapping[str, Missing] = field(default_factory=dict, hash=False)
    ceilings: Mapping[str, Ceiling] = field(default_factory=dict, hash=False)
    totals: Mapping[str, float] = field(default_factory=dict, hash=False)
    methods: tuple[str, ...] = ()
    pci: str | None = None  # a GPU's PCI address
    link_text: str | None = None  # its PCIe link as lspci writes it

    def value(self, figure: str) -> float | None:
        """A figure per second, or None (see ``missing``)."""
        return self.figures.get(figure)

    def share(self, link: str) -> float | None:
        """The share of ``link``'s ceiling the traffic on it takes."""
        ceiling = self.ceilings.get(link)
        if ceiling is None:
            return None
        figures = GPU_LINKS[link] if self.kind == "gpu" else (MEM_READ, MEM_WRITE)
        return ceiling.share([self.value(f) for f in figures])


@dataclass(frozen=True)
class ProcessNode:
    """A process's resident memory on one node, the anonymous part of it (heap, stacks,
    anonymous mappings: what it allocated, not files it mapped), and their change over
    the interval."""

    node: int
    name: str
    tier: str
    resident: int  # bytes
    change_per_s: float  # bytes per second
    anonymous: int = 0  # bytes
    anonymous_change_per_s: float = 0.0  # bytes per second


@dataclass(frozen=True)
class ProcessView:
    """A process's pages per tier (numa_maps); ``exited``: it ended in the interval."""

    pid: int
    nodes: tuple[ProcessNode, ...]
    exited: bool = False


@dataclass(frozen=True)
class TopReport:
    """One interval: when it ended, how long it was, GPUs, nodes, the process."""

    time: str  # ISO 8601, UTC
    interval_s: float
    gpus: tuple[Row, ...]
    nodes: tuple[Row, ...]
    process: ProcessView | None = None
    absent: tuple[str, ...] = ()  # what the host lacks (no GPU, ...), in words

    @property
    def missing(self) -> dict[str, tuple[Missing, tuple[str, ...]]]:
        """Each reason a figure is missing (by its short word), and the rows it is
        missing for."""
        out: dict[str, tuple[Missing, tuple[str, ...]]] = {}
        for row in (*self.gpus, *self.nodes):
            for m in row.missing.values():
                first, names = out.get(m.short, (m, ()))
                if row.name not in names:
                    names = (*names, row.name)
                out[m.short] = (first, names)
        return out


def top(
    interval: float = 1.0,
    count: int | None = None,
    pid: int | None = None,
    *,
    system: System | None = None,
) -> Iterator[TopReport]:
    """Reports every ``interval`` seconds, ``count`` of them (forever when None): per GPU
    the traffic on its links and how busy its memory is, per NUMA node the memory read
    and written and its page traffic, and with ``pid`` that process's resident memory per
    node. Ends after the report in which the process ended. Sources are opened once and
    closed when the iteration ends."""
    interval = finite(interval, "interval (seconds)")
    if count is not None:
        count = whole_count(count, "count (reports)")
    if pid is not None:
        pid = check_pid(pid)
    system = system or snapshot()
    system.require_live("pycxl top")  # counters are this machine's, not a tree's
    fs = system.sysfs()
    watched = _Process(fs, pid) if pid is not None else None
    try:
        readers = open_readers(system, fs)
    except BaseException:
        if watched is not None:
            watched.close()
        raise
    try:
        before = [r.read() for r in readers]
        made = 0
        while count is None or made < count:
            wait = max(0.0, before[0].time + interval - time.monotonic())
            if watched is not None:
                watched.sleep(wait)  # the report comes as soon as the process ends
            else:
                time.sleep(wait)
            now = [r.read() for r in readers]
            view = watched.view(system, now[0].time) if watched else None
            yield report(system, now, before, view)
            made += 1
            if view is not None and view.exited:
                return
            before = now
    finally:
        for r in readers:
            r.close()
        if watched is not None:
            watched.close()


def open_readers(system: System, fs: Sysfs) -> list[Reader]:
    """Every source, opened for ``system``'s nodes and GPUs (page traffic first: it is
    always there, and times the intervals)."""
    cpu_nodes = {cpu: nt.node.id for nt in system.nodes for cpu in nt.node.cpus}
    sockets = [nt.node.id for nt in system.nodes if nt.node.cpus and nt.node.has_memory]
    readers: list[Reader] = [
        page_traffic.open_reader(fs),
        memory_pmus.open_reader(fs, cpu_nodes, sockets, _cxl_memdevs(system)),
        resctrl.open_reader(fs, cpu_nodes, sockets),
    ]
    if system.gpus.devices:
        from ..gpu import link_counters

        best = {g.index: _pcie_best(g, fs) for g in system.gpus.devices}
        readers.append(link_counters.open_reader(system.gpus.devices,
                                                 {i: b for i, b in best.items() if b}))  # fmt: skip
    return readers


def _pcie_best(g: GpuDevice, fs: Sysfs) -> float | None:
    """A GPU's PCIe bandwidth at its link's best speed (bytes/s), where sysfs says."""
    link = read_link(g.pci_bus_id, fs)
    return None if link is None else link.bandwidth(best_speed=True)


def _cxl_memdevs(system: System) -> dict[int, list[str]]:
    """Each CXL node and the memdevs of the regions that feed it."""
    out: dict[int, list[str]] = {nt.node.id: [] for nt in system.nodes if nt.tier == "cxl"}
    for r in system.cxl.regions:
        for node in r.numa_nodes:
            if node in out:
                out[node] += [m for m in r.memdevs if m not in out[node]]
    return out


def report(system: System, now: list[Reading], before: list[Reading],
           view: ProcessView | None = None) -> TopReport:  # fmt: skip
    """The report of one interval: the sources' readings at its end (``now``) and at its
    start (``before``, in the same order), on ``system``'s GPUs and nodes, each figure
    beside its ceiling (links read from ``system``'s tree)."""
    fs = system.sysfs()
    merged = _Merged(now, before)
    gpus = tuple(_gpu_row(g, fs, merged) for g in system.gpus.devices)
    nodes = []
    for nt in system.nodes:
        parts = merged.of(("node", nt.node.id), NODE_FIGURES)
        for f in (MEM_READ, MEM_WRITE):
            if f not in parts["figures"] and f not in parts["missing"]:
                parts["missing"][f] = NOT_COUNTED
        nodes.append(Row("node", nt.name, nt.node.id, nt.tier, **parts,
                         ceilings=_node_ceiling(system, fs, nt.node.id)))  # fmt: skip
    return TopReport(
        time=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        interval_s=now[0].time - before[0].time,
        gpus=gpus,
        nodes=tuple(nodes),
        process=view,
        absent=tuple(system.absent),
    )


class _Merged:
    """Every source's rates, totals, missing figures and methods of one interval."""

    def __init__(self, now: list[Reading], before: list[Reading]) -> None:
        self.rates: dict[Key, float] = {}
        self.totals: dict[Key, float] = {}
        self.missing: dict[Key, Missing] = {}
        self.methods: dict[Subject, list[str]] = {}
        for n, b in zip(now, before, strict=True):
            self.rates |= per_second(n, b)
            self.totals |= n.totals
            self.missing |= n.missing
            for subject, how in n.methods.items():
                self.methods.setdefault(subject, []).append(how)

    def of(self, subject: Subject, names: Mapping[str, str]) -> dict[str, Any]:
        """A row's figures, missing figures, totals and methods (Row's fields)."""
        r, t, m = self.rates, self.totals, self.missing
        return {
            "figures": {f: r[(subject, f)] for f in names if (subject, f) in r},
            "missing": {f: m[(subject, f)] for f in names
                        if (subject, f) in m and (subject, f) not in r},
            "totals": {f: t[(subject, f)] for f in names if (subject, f) in t},
            "methods": tuple(self.methods.get(subject, ())),
        }  # fmt: skip


def _gpu_row(g: GpuDevice, fs: Sysfs, merged: _Merged) -> Row:
    """A GPU's figures beside its links' ceilings: its PCIe link at the best speed both
    ends support (a GPU lowers the speed while idle, and raises it under load), its
    NVLink and C2C links as NVML reports them."""
    subject: Subject = ("gpu", g.index)
    link = read_link(g.pci_bus_id, fs)
    ceilings = {}
    if link is not None and (pcie := link.bandwidth(best_speed=True)) is not None:
        speed = link.max_speed if link.max_speed is not None else link.speed
        ceilings["pcie"] = Ceiling(pcie, f"PCIe {speed:g}GT/s x{link.width}")
    for name, key in LINK_MAXIMA.items():
        if (subject, key) in merged.rates:
            ceilings[name] = Ceiling(merged.rates[(subject, key)], f"{name} links, as NVML says")
    return Row("gpu", g.target_name, g.index, "gpu", **merged.of(subject, GPU_FIGURES),
               ceilings=ceilings, pci=g.pci_bus_id,
               link_text=None if link is None else link.lspci_text())  # fmt: skip


def _node_ceiling(system: System, fs: Sysfs, node: int) -> dict[str, Ceiling]:
    """A CXL node's: its memdevs' PCIe links together; a node with CPUs: the read
    bandwidth the platform advertises for it (HMAT), where it does."""
    memdevs = [system.cxl.memdev_or_none(m) for m in _cxl_memdevs(system).get(node, [])]
    if memdevs and all(m is not None for m in memdevs):
        links = [read_link(m.host, fs) for m in memdevs if m is not None]
        bw = [link.bandwidth() if link is not None else None for link in links]
        if all(b is not None for b in bw):
            what = f"{len(bw)} memdevs' PCIe links" if len(bw) > 1 else "the memdev's PCIe link"
            return {"memory": Ceiling(sum(b for b in bw if b is not None), what)}
        return {}
    nt = system.tier(node)
    advertised = nt.node.advertised if nt is not None else None
    if advertised is not None and advertised.read_bytes_per_s:
        return {"memory": Ceiling(float(advertised.read_bytes_per_s), "HMAT", duplex=False)}
    return {}


class _Process:
    """A process watched: its resident and anonymous bytes per node at the last look."""

    def __init__(self, fs: Sysfs, pid: int) -> None:
        from ..numa.pages import process_memory

        self.fs, self.pid = fs, pid
        self.last = process_memory(pid, fs)  # NotFoundError now, for a PID that is not there
        self.when = time.monotonic()
        try:  # readable once the process ends (Linux 5.3+)
            self._pidfd: int | None = os.pidfd_open(pid)
        except OSError:
            self._pidfd = None

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or until the process ends if that comes first."""
        if self._pidfd is None:
            time.sleep(seconds)
        else:
            select.select([self._pidfd], [], [], seconds)

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def view(self, system: System, now: float) -> ProcessView:
        from ..numa.pages import process_memory

        try:
            usage = {} if self._ended() else process_memory(self.pid, self.fs)
            exited = not usage and self._ended()
        except NotFoundError:
            usage, exited = {}, True
        dt = max(now - self.when, 1e-9)
        nodes = []
        for node in sorted(set(usage) | set(self.last)):
            t = system.tier(node)
            (resident, anon), (was, was_anon) = usage.get(node, (0, 0)), self.last.get(node, (0, 0))
            name, tier = (t.name, t.tier) if t else (f"node{node}", "?")
            nodes.append(ProcessNode(node, name, tier, resident, (resident - was) / dt, anon,
                                     (anon - was_anon) / dt))  # fmt: skip
        self.last, self.when = usage, now
        return ProcessView(self.pid, tuple(nodes), exited)

    def _ended(self) -> bool:
        """Gone, or a zombie (ended, not yet reaped: its numa_maps is empty)."""
        stat = self.fs.read(f"/proc/{self.pid}/stat")
        return stat is None or stat.rpartition(")")[2].split()[:1] == ["Z"]


# the JSON of a report (pycxl top --json)
def top_row_json(row: Row) -> Json:
    """A row of top (a GPU or a node) as ``pycxl top --json`` prints it."""
    names = GPU_FIGURES if row.kind == "gpu" else NODE_FIGURES
    if row.kind == "gpu":
        doc: Json = {"gpu": row.name, "index": row.id}
    else:
        doc = {"name": row.name, "node": row.id, "tier": row.tier}
    if row.pci is not None:
        doc["pci"] = row.pci
        doc["pcie_lnksta"] = row.link_text
    doc |= {key: row.figures.get(f) for f, key in names.items()
            if f in row.figures or f in row.missing}  # fmt: skip
    for link, c in row.ceilings.items():
        prefix = "" if link == "memory" else f"{link}_"
        doc[f"{prefix}max_bytes_per_s"] = c.bytes_per_s
        doc[f"{prefix}max_basis"] = c.basis
        doc[f"{prefix}share"] = row.share(link)
    doc["missing"] = {names[f]: m.reason for f, m in row.missing.items() if f in names}
    doc["methods"] = list(row.methods)
    return doc


def process_node_json(n: ProcessNode) -> Json:
    """A process's resident bytes on one node and their change."""
    return {
        "node": n.node,
        "name": n.name,
        "tier": n.tier,
        "resident_bytes": n.resident,
        "change_bytes_per_s": n.change_per_s,
        "anonymous_bytes": n.anonymous,
        "anonymous_change_bytes_per_s": n.anonymous_change_per_s,
    }


def process_view_json(p: ProcessView) -> Json:
    """The process, whether it ended, and its memory per node."""
    return {"pid": p.pid, "exited": p.exited, "nodes": [process_node_json(n) for n in p.nodes]}


def top_report_json(r: TopReport) -> Json:
    """A top report as ``pycxl top --json`` prints it (one line per report)."""
    return {
        "time": r.time,
        "interval_s": round(r.interval_s, 3),
        "gpus": [top_row_json(g) for g in r.gpus],
        "nodes": [top_row_json(n) for n in r.nodes],
        "process": None if r.process is None else process_view_json(r.process),
        "absent": list(r.absent),
    }
