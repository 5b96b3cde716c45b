"""The kernel's memory-tiering state and counters: memory tiers, demotion and
NUMA-balancing mode, weighted-interleave weights, and the page counters of
``/proc/vmstat`` and each node's ``vmstat`` (promotions, demotions, migrations,
NUMA-balancing hint faults, long-term pins).

Counters are read as the kernel keeps them (totals since boot); rates are differences
of two samples (``Sample.rates``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..base.sysfs import Sysfs
from .nodes import NODE_DIR, read_nodes

TIERING_DIR = "/sys/devices/virtual/memory_tiering"
DEMOTION = "/sys/kernel/mm/numa/demotion_enabled"
NUMA_BALANCING = "/proc/sys/kernel/numa_balancing"
WEIGHTS_DIR = "/sys/kernel/mm/mempolicy/weighted_interleave"
PMU_DIR = "/sys/bus/event_source/devices"

# per node: what moved between tiers, NUMA allocation outcomes, long-term pins
NODE_COUNTERS = (
    "pgpromote_success",
    "pgdemote_kswapd",
    "pgdemote_direct",
    "pgdemote_khugepaged",
    "pgdemote_proactive",
    "numa_hit",
    "numa_miss",
    "numa_foreign",
    "numa_interleave",
    "numa_local",
    "numa_other",
    "nr_foll_pin_acquired",
    "nr_foll_pin_released",
)
# whole system: page migration and the NUMA-balancing scanner
SYSTEM_COUNTERS = (
    "pgmigrate_success",
    "pgmigrate_fail",
    "numa_pages_migrated",
    "numa_hint_faults",
    "numa_hint_faults_local",
    "numa_pte_updates",
    "thp_migration_success",
    "pgpromote_success",
    "pgpromote_candidate",
    "pgdemote_kswapd",
    "pgdemote_direct",
)
DEMOTE = ("pgdemote_kswapd", "pgdemote_direct", "pgdemote_khugepaged", "pgdemote_proactive")
# /proc/sys/kernel/numa_balancing bits
BALANCING_MODES = {0: "off", 1: "normal", 2: "memory-tiering", 3: "normal+memory-tiering"}


@dataclass(frozen=True)
class TieringState:
    """How the kernel tiers memory now. ``None`` where this kernel does not say."""

    memory_tiers: dict[int, tuple[int, ...]]  # tier id -> nodes (lower id: faster)
    demotion_enabled: bool | None
    numa_balancing: str | None  # off, normal, memory-tiering, normal+memory-tiering
    weights: dict[int, int]  # node -> weighted-interleave weight
    cxl_pmus: tuple[str, ...]  # cxl_pmu perf PMUs the kernel registered

    def tier_of(self, node: int) -> int | None:
        """The memory tier id holding ``node``."""
        return next((t for t, nodes in self.memory_tiers.items() if node in nodes), None)


@dataclass(frozen=True)
class NodeCounters:
    """One node's memory and counters at one moment."""

    node: int
    mem_total: int  # bytes
    mem_free: int  # bytes
    counters: dict[str, int] = field(hash=False)

    @property
    def demoted(self) -> int:
        """Pages demoted from this node, all reasons."""
        return sum(self.counters.get(k, 0) for k in DEMOTE)

    @property
    def promoted(self) -> int:
        """Pages promoted to this node."""
        return self.counters.get("pgpromote_success", 0)

    @property
    def pinned(self) -> int:
        """Pages of this node held by long-term pins (GPU registration, RDMA) now."""
        c = self.counters
        return c.get("nr_foll_pin_acquired", 0) - c.get("nr_foll_pin_released", 0)


@dataclass(frozen=True)
class Sample:
    """Every node's counters and the system's, read at ``time`` (monotonic seconds)."""

    time: float
    nodes: tuple[NodeCounters, ...]
    system: dict[str, int] = field(hash=False)

    def rates(self, earlier: Sample) -> tuple[dict[int, dict[str, float]], dict[str, float]]:
        """Per second since ``earlier``: per node (promoted, demoted, numa_* and the
        pin counters) and system-wide counters."""
        dt = max(self.time - earlier.time, 1e-9)
        before = {n.node: n for n in earlier.nodes}
        per_node: dict[int, dict[str, float]] = {}
        for n in self.nodes:
            b = before.get(n.node)
            if b is None:
                continue  # a node that came online between the samples
            r = {k: (v - b.counters.get(k, 0)) / dt for k, v in n.counters.items()}
            r["promoted"] = (n.promoted - b.promoted) / dt
            r["demoted"] = (n.demoted - b.demoted) / dt
            per_node[n.node] = r
        system = {k: (v - earlier.system.get(k, 0)) / dt for k, v in self.system.items()}
        return per_node, system


def read_counters(fs: Sysfs, rel: str, names: tuple[str, ...]) -> dict[str, int]:
    """The named counters of a vmstat-format file (those this kernel has)."""
    wanted = set(names)
    out = {}
    for line in fs.iter_lines(rel):
        key, _, value = line.partition(" ")
        if key in wanted and value.strip().lstrip("-").isdecimal():
            out[key] = int(value)
    return out


def sample(fs: Sysfs | None = None) -> Sample:
    """Read every node's memory and counters and the system counters, once."""
    fs = fs or Sysfs()
    nodes = tuple(
        NodeCounters(
            n.id,
            n.mem_total,
            n.mem_free,
            read_counters(fs, f"{NODE_DIR}/node{n.id}/vmstat", NODE_COUNTERS),
        )
        for n in read_nodes(fs)
    )
    return Sample(time.monotonic(), nodes, read_counters(fs, "/proc/vmstat", SYSTEM_COUNTERS))


def read_tiering(fs: Sysfs | None = None) -> TieringState:
    """Memory tiers, demotion, NUMA balancing, interleave weights, CXL PMUs."""
    fs = fs or Sysfs()
    tiers = {}
    for name in fs.listdir(TIERING_DIR):
        if name.startswith("memory_tier") and name[len("memory_tier") :].isdecimal():
            nodelist = fs.read_cpulist(f"{TIERING_DIR}/{name}/nodelist")
            tiers[int(name[len("memory_tier") :])] = nodelist or ()
    balancing = fs.read_int(NUMA_BALANCING)
    weights = {}
    for name in fs.listdir(WEIGHTS_DIR):
        if name.startswith("node") and name[4:].isdecimal():
            w = fs.read_int(f"{WEIGHTS_DIR}/{name}")
            if w is not None:
                weights[int(name[4:])] = w
    return TieringState(
        memory_tiers=dict(sorted(tiers.items())),
        demotion_enabled=_true_false(fs.read(DEMOTION)),
        numa_balancing=None
        if balancing is None
        else BALANCING_MODES.get(balancing, str(balancing)),
        weights=weights,
        cxl_pmus=tuple(sorted(p for p in fs.listdir(PMU_DIR) if p.startswith("cxl_pmu"))),
    )


def _true_false(text: str | None) -> bool | None:
    """demotion_enabled prints 'true'/'false' (older kernels: 1/0)."""
    if text is None:
        return None
    return text.strip() in ("true", "1", "Y")
