"""Result objects of every benchmark: one shape for tables, JSON and plots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BenchResult:
    """One measurement of one target from one initiator.

    ``figures`` hold the numbers, with units in the key (``latency_ns``,
    ``bytes_per_s``, ``p99_ns``...); ``params`` the settings that produced them.
    """

    benchmark: str  # 'latency', 'bandwidth', 'first-touch'
    target: str  # the name the user gave (cxl0, dram0, node1)
    node: int | None  # NUMA node of the target memory
    initiator: str  # dram0, cpu3...
    cpus: tuple[int, ...]  # CPUs that ran the measurement
    size: int  # bytes of the working set (per array for bandwidth)
    page_size: int
    figures: dict[str, float]
    params: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "target": self.target,
            "node": self.node,
            "initiator": self.initiator,
            "cpus": list(self.cpus),
            "size": self.size,
            "page_size": self.page_size,
            **self.figures,
            **self.params,
        }
