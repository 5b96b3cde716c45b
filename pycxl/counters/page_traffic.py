"""Page traffic per node, which every kernel counts (``nodeN/vmstat``, as numastat and
``pycxl stat`` read it): allocations on the node (``numa_hit`` + ``numa_miss``), those
made for a process running on the node and on another one (``numa_local``,
``numa_other``), and pages promoted to and demoted from it."""

from __future__ import annotations

from ..base.sysfs import Sysfs
from ..numa.vmstat import sample
from .base import ALLOC, DEMOTED, LOCAL, PROMOTED, REMOTE, Key, Missing, Reading, Subject

SOURCE = "vmstat"
# figure -> the node counters it adds up
SUMS = {
    ALLOC: ("numa_hit", "numa_miss"),
    LOCAL: ("numa_local",),
    REMOTE: ("numa_other",),
}


class PageTraffic:
    """Every node's page counters; nothing to open or close."""

    source = SOURCE

    def __init__(self, fs: Sysfs) -> None:
        self.fs = fs

    def read(self) -> Reading:
        """Every node's allocations and tier moves since boot."""
        s = sample(self.fs)
        totals: dict[Key, float] = {}
        missing: dict[Key, Missing] = {}
        for n in s.nodes:
            subject: Subject = ("node", n.node)
            for figure, names in SUMS.items():
                if all(k in n.counters for k in names):
                    totals[(subject, figure)] = sum(n.counters[k] for k in names)
                else:
                    missing[(subject, figure)] = Missing(
                        "no-counter",
                        f"node {n.node}'s vmstat has no {' or '.join(names)} (a kernel "
                        "without NUMA statistics: CONFIG_NUMA, vm.numa_stat=1)",
                    )
            totals[(subject, PROMOTED)] = n.promoted
            totals[(subject, DEMOTED)] = n.demoted
        methods: dict[Subject, str] = {("node", n.node): "node vmstat" for n in s.nodes}
        return Reading(SOURCE, s.time, totals=totals, missing=missing, methods=methods)

    def close(self) -> None:
        """Nothing to let go of."""


def open_reader(fs: Sysfs) -> PageTraffic:
    """The page-traffic reader of the host ``fs`` reads."""
    return PageTraffic(fs)
