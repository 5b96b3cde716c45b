"""What every counter source returns: readings of counts and rates by subject and
figure, and the reasons for the figures a host does not have."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

SubjectKind = Literal["node", "gpu"]
Subject = tuple[SubjectKind, int]  # ("node", 1), ("gpu", 0): a node id or a GPU index
Key = tuple[Subject, str]  # a subject and one of its figures: (("gpu", 0), PCIE_RX)

# Figures, in bytes unless said. GPUs: their links, both directions as the GPU sees
# them (received: host to GPU), and how busy their memory is.
PCIE_RX, PCIE_TX = "pcie_rx", "pcie_tx"
NVLINK_RX, NVLINK_TX = "nvlink_rx", "nvlink_tx"
C2C_RX, C2C_TX = "c2c_rx", "c2c_tx"
HBM_BUSY = "hbm_busy"  # a ratio (0-1), sampled by the driver
# Nodes: memory read and written at its controllers (uncore or CXL device counters),
# and what its CPUs moved to and from memory as resctrl sees it (read and write together)
MEM_READ, MEM_WRITE = "mem_read", "mem_write"
MBM_LOCAL, MBM_TOTAL = "mbm_local", "mbm_total"
# Nodes' page traffic, as the kernel counts it (allocations are events: one per page or
# per huge page; promotions and demotions are pages)
ALLOC, LOCAL, REMOTE = "alloc", "local", "remote"
PROMOTED, DEMOTED = "promoted", "demoted"


@dataclass(frozen=True)
class Missing:
    """Why a figure is not there: ``short`` is one token for a column (``no-PMU``,
    ``needs-root``, ``paranoid-2``), ``reason`` a sentence saying why and what to do."""

    short: str
    reason: str


@dataclass(frozen=True)
class Reading:
    """One read of a source at ``time`` (monotonic seconds).

    ``totals``: counts that only grow (bytes, pages, events), their own time in
    ``stamps`` where the source dates them; ``rates``: figures the source gives only
    per second (or as ratios); ``missing``: figures this host lacks, and why;
    ``methods``: per subject, how the figures were read, in words."""

    source: str
    time: float
    totals: Mapping[Key, float] = field(default_factory=dict)
    stamps: Mapping[Key, float] = field(default_factory=dict)
    rates: Mapping[Key, float] = field(default_factory=dict)
    missing: Mapping[Key, Missing] = field(default_factory=dict)
    methods: Mapping[Subject, str] = field(default_factory=dict)


class Reader(Protocol):
    """A source opened for reading; ``close()`` lets go of what it holds."""

    source: str

    def read(self) -> Reading:
        """The source's counts now."""
        ...

    def close(self) -> None:
        """Let go of what the reader holds (file descriptors)."""
        ...


def per_second(now: Reading, before: Reading) -> dict[Key, float]:
    """The totals' growth per second from ``before`` to ``now``, each over its own
    stamps where both readings have them, and the rates ``now`` carries."""
    out: dict[Key, float] = dict(now.rates)
    for key, value in now.totals.items():
        if key not in before.totals:
            continue  # appeared between the readings (a node came online)
        t1, t0 = now.stamps.get(key), before.stamps.get(key)
        dt = (t1 - t0) if t1 is not None and t0 is not None and t1 > t0 else now.time - before.time
        out[key] = (value - before.totals[key]) / max(dt, 1e-9)
    return out
