"""How long a boot has gone without progress, measured so that a busy host does not
count against it.

The measure is the emulator's own CPU time (virtme-ng and QEMU: the boot's process
group): a guest starved of CPU by other work, or by its own ``nice``, uses little of it
and is not ended for being slow. A guest that is blocked (waiting on something that never
comes) uses none either, so the wall clock ends it too, at WALL_FACTOR times the limit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

WALL_FACTOR = 3.0  # wall-clock backstop, in multiples of the CPU-time limit
_TICK = os.sysconf("SC_CLK_TCK")


def _group_stats(pgid: int, proc: str) -> Iterator[list[str]]:
    """The fields after the command in /proc/PID/stat of each process of group ``pgid``:
    state (0), ppid, pgrp (2) ... utime, stime (11, 12)."""
    for entry in os.listdir(proc):
        if not entry.isdecimal():
            continue
        try:
            with open(f"{proc}/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) > 12 and int(fields[2]) == pgid:
            yield fields


def group_cpu_s(pgid: int, proc: str = "/proc") -> float:
    """CPU seconds (user and system) used by the live processes of process group
    ``pgid``."""
    return sum(int(f[11]) + int(f[12]) for f in _group_stats(pgid, proc)) / _TICK


def group_alive(pgid: int, proc: str = "/proc") -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie, killed and not yet
    reaped, does not count)."""
    return any(f[0] not in ("Z", "X") for f in _group_stats(pgid, proc))


@dataclass
class ProgressClock:
    """Emulator CPU seconds and wall seconds since the last sign of progress."""

    pgid: int
    limit_s: float
    _cpu_high: float = field(default=0.0, init=False)  # processes that exit take theirs
    _cpu_mark: float = field(default=0.0, init=False)
    _wall_mark: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self.progress()

    def cpu_s(self) -> float:
        """The group's CPU seconds so far (never decreasing)."""
        self._cpu_high = max(self._cpu_high, group_cpu_s(self.pgid))
        return self._cpu_high

    def progress(self) -> None:
        """The guest showed progress now: both clocks start again."""
        self._cpu_mark, self._wall_mark = self.cpu_s(), time.monotonic()

    def expired(self) -> str | None:
        """Why the limit is passed ('120 s of emulator CPU time'), or None."""
        cpu = self.cpu_s() - self._cpu_mark
        wall = time.monotonic() - self._wall_mark
        if cpu > self.limit_s:
            return f"{self.limit_s:.0f} s of emulator CPU time ({wall:.0f} s of wall time)"
        if wall > self.limit_s * WALL_FACTOR:
            return (
                f"{wall:.0f} s of wall time ({cpu:.0f} s of emulator CPU time: a blocked "
                "or starved guest)"
            )
        return None
