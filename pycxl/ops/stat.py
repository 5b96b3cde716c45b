"""``pycxl stat``: memory tiers as vmstat shows memory. The first report gives the
kernel's totals since boot; each later one, rates over its interval: per node (used,
free, pinned, promoted, demoted, NUMA allocation misses) and system-wide (migrations,
NUMA-balancing hint faults), next to the tiering state (memory tiers, demotion,
NUMA-balancing mode, weighted-interleave weights, CXL PMUs).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..base.jsontype import Json
from ..base.values import count as whole_count, finite
from ..numa.vmstat import Sample, TieringState, read_tiering, sample
from ..resolve.system import System

PAGE = 4096  # vmstat counts pages of the base page size
CXL_PMU_ABSENT = "absent: the kernel registered no cxl_pmu perf PMU (device or driver lacks one)"


@dataclass(frozen=True)
class NodeStat:
    """One node in one report. ``rates`` are per second over the interval (None in the
    first report, which carries the totals since boot in ``totals``)."""

    node: int
    name: str  # dram0, cxl0, node3
    tier: str  # dram, cxl, cpuless
    memory_tier: int | None
    total: int  # bytes
    free: int  # bytes
    pinned: int  # bytes held by long-term pins now
    totals: dict[str, int] = field(hash=False)
    rates: dict[str, float] | None = field(default=None, hash=False)

    @property
    def used(self) -> int:
        """Bytes in use."""
        return self.total - self.free


@dataclass(frozen=True)
class StatReport:
    """One report: when, over which interval (None: since boot), nodes, system."""

    time: str
    interval_s: float | None
    nodes: tuple[NodeStat, ...]
    system_totals: dict[str, int] = field(hash=False)
    system_rates: dict[str, float] | None = field(default=None, hash=False)
    tiering: TieringState | None = field(default=None, hash=False)


def _report(
    system: System, now: Sample, before: Sample | None, tiering: TieringState
) -> StatReport:
    node_rates, system_rates = now.rates(before) if before is not None else ({}, None)
    nodes = []
    for n in now.nodes:
        t = system.tier(n.node)
        totals = dict(n.counters) | {"promoted": n.promoted, "demoted": n.demoted}
        nodes.append(
            NodeStat(
                node=n.node,
                name=t.name if t else f"node{n.node}",
                tier=t.tier if t else "?",
                memory_tier=tiering.tier_of(n.node),
                total=n.mem_total,
                free=n.mem_free,
                # acquired minus released, read from per-CPU batched counters: briefly
                # below zero on an idle node (-4 pages seen), never fewer than none
                pinned=max(0, n.pinned) * PAGE,
                totals=totals,
                rates=node_rates.get(n.node) if before is not None else None,
            )
        )
    return StatReport(
        time=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        interval_s=None if before is None else round(now.time - before.time, 3),
        nodes=tuple(nodes),
        system_totals=dict(now.system),
        system_rates=system_rates,
        tiering=tiering,
    )


def stat(
    system: System,
    interval: float | None = None,
    count: int | None = None,
) -> Iterator[StatReport]:
    """Reports as vmstat gives them: without ``interval`` one report (totals since
    boot); with it, ``count`` reports (forever when None), the first since boot, each
    later one with rates over ``interval`` seconds. The counters are read from the tree
    ``system`` was read from."""
    if interval is not None:
        interval = finite(interval, "interval (seconds)")
    if count is not None:
        count = whole_count(count, "count (reports)")
    fs = system.sysfs()
    before = sample(fs)
    yield _report(system, before, None, read_tiering(fs))
    if interval is None:
        return
    made = 1
    while count is None or made < count:
        time.sleep(max(0.0, before.time + interval - time.monotonic()))
        now = sample(fs)
        yield _report(system, now, before, read_tiering(fs))
        before = now
        made += 1


# the JSON of a report (pycxl stat --json)
def node_stat_json(n: NodeStat) -> Json:
    """One node's memory, counters and (after the first report) rates."""
    return {
        "node": n.node,
        "name": n.name,
        "tier": n.tier,
        "memory_tier": n.memory_tier,
        "total": n.total,
        "used": n.used,
        "free": n.free,
        "pinned": n.pinned,
        "totals": n.totals,
        "rates_per_s": n.rates,
    }


def tiering_json(t: TieringState) -> Json:
    """The tiering state: memory tiers, demotion, balancing, weights, CXL PMUs."""
    return {
        "memory_tiers": {str(k): list(v) for k, v in t.memory_tiers.items()},
        "demotion_enabled": t.demotion_enabled,
        "numa_balancing": t.numa_balancing,
        "interleave_weights": {str(k): v for k, v in t.weights.items()},
        "cxl_pmus": list(t.cxl_pmus) or None,
        "cxl_pmu": "present" if t.cxl_pmus else CXL_PMU_ABSENT,
    }


def stat_report_json(r: StatReport) -> Json:
    """A stat report as ``pycxl stat --json`` prints it (one line per report)."""
    t = r.tiering
    return {
        "time": r.time,
        "interval_s": r.interval_s,
        "nodes": [node_stat_json(n) for n in r.nodes],
        "system": {"totals": r.system_totals, "rates_per_s": r.system_rates},
        "tiering": None if t is None else tiering_json(t),
    }
