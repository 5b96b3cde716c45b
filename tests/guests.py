"""The testbed boots of a test session, host side: started as soon as the session knows
its tests, and run beside the host's own tests, each boot in a thread of its own (the
emulator is a process of its own) and at most GUESTS at once. A topology with much to do
is split into batches that boot side by side; a docs walk-through stays in one batch (its
lines build on each other). The tests then read their outcomes from here.

Batches are balanced by the seconds each unit took in a recorded guest run
(tests/data/testbed-durations.json, from the guest's own report: ``python -m
tests.guests WORKDIR...`` writes it again); a unit it does not know counts as
UNKNOWN_S."""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DURATIONS = Path(__file__).parent / "data" / "testbed-durations.json"
UNKNOWN_S = 10.0
GUESTS = 2  # emulators at once; PYCXL_TESTBED_GUESTS sets another count
BATCH_S = 420.0  # a topology with more than this much recorded work is split
BOOT_S = 60.0  # what one more boot costs: a topology is split only where it pays


@dataclass(frozen=True)
class Batch:
    topology: str
    nodeids: tuple[str, ...]
    seconds: float  # recorded work, for the schedule


def guests_at_once() -> int:
    text = os.environ.get("PYCXL_TESTBED_GUESTS", "")
    return int(text) if text.isdecimal() and int(text) > 0 else GUESTS


def recorded_durations() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS.read_text())
    except FileNotFoundError:
        return {}
    return {str(k): float(v) for k, v in data.items()}


def plan_batches(
    units_by_topology: Mapping[str, list[tuple[str, list[str]]]],
    durations: Mapping[str, float],
    guests: int,
) -> list[Batch]:
    """Batches, longest first. ``units_by_topology``: per topology, its units in the
    session's order, each (unit, its node ids in order)."""
    batches: list[Batch] = []
    for topo, units in units_by_topology.items():
        cost = [sum(durations.get(n, UNKNOWN_S) for n in ids) for _, ids in units]
        total = sum(cost)
        shards = max(1, min(guests, len(units), int(total // BATCH_S) + 1))
        while shards > 1 and total / shards < BOOT_S:
            shards -= 1
        loads = [0.0] * shards
        chosen: list[list[int]] = [[] for _ in range(shards)]
        for i in sorted(range(len(units)), key=lambda i: -cost[i]):  # longest first
            k = loads.index(min(loads))
            loads[k] += cost[i]
            chosen[k].append(i)
        for k in range(shards):
            ids = tuple(n for i in sorted(chosen[k]) for n in units[i][1])  # session order
            if ids:
                batches.append(Batch(topo, ids, loads[k]))
    return sorted(batches, key=lambda b: -b.seconds)


class GuestRuns:
    """The session's boots, started at once; ``outcomes(nodeid)`` waits for its batch."""

    def __init__(
        self, batches: Iterable[Batch], run: Callable[[Batch, threading.Event], dict[str, Any]]
    ) -> None:
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=guests_at_once(), thread_name_prefix="testbed")
        self._futures: dict[Batch, Future[dict[str, Any]]] = {}
        self._batch_of: dict[str, Batch] = {}
        for batch in batches:
            self._futures[batch] = self._pool.submit(run, batch, self._stop)
            self._batch_of.update(dict.fromkeys(batch.nodeids, batch))
        self._told: dict[Batch, str] = {}

    def batch_of(self, nodeid: str) -> Batch | None:
        return self._batch_of.get(nodeid)

    def outcomes(self, batch: Batch) -> dict[str, Any]:
        out = self._futures[batch].result()
        self._told[batch] = (f"testbed {batch.topology}: {len(batch.nodeids)} tests, "
                             f"{out['__said__']}")  # fmt: skip
        return out

    def told(self) -> list[str]:
        """A line for each batch whose outcomes were read: its boots and exit."""
        return list(self._told.values())

    def close(self) -> None:
        """Ends every boot still running (a session cut short) and waits for the threads."""
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)


def run_batch(
    batch: Batch, stop: threading.Event, rootpath: Path, env: Mapping[str, str]
) -> dict[str, Any]:
    """One batch in one guest: each test's outcome record by node id, the guest's output
    under ``__output__`` and how the boots went under ``__said__``."""
    from pycxl.base.errors import TestbedError
    from pycxl.testbed import progress, run_in_guest
    from pycxl.testbed.runner import new_workdir

    cmd = shlex.join(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *batch.nodeids]
    )
    workdir = new_workdir(batch.topology)
    try:
        result = run_in_guest(
            cmd, batch.topology, cwd=str(rootpath), env=env, workdir=workdir, stop=stop
        )
        output = result.output
        said = f"{result.boots} boot(s), guest pytest exit {result.returncode}"
    except TestbedError as e:
        # What the guest reported before its boots stopped still stands; the tests it
        # never reported fail with this error (remembered, so they report it instead
        # of booting again one by one).
        output, said = str(e), "the guest stopped before it finished"
    out: dict[str, Any] = {"__output__": {"text": output}, "__said__": said}
    for rec in progress.outcomes(workdir):
        prev = out.get(rec["nodeid"])
        # a failure in any phase (setup, call, teardown) fails the test
        if prev is None or prev["outcome"] == "passed":
            out[rec["nodeid"]] = rec
    return out


def record_durations(workdirs: Iterable[Path]) -> dict[str, float]:
    """Each unit's seconds in the guest (every phase), from the reports of guest runs."""
    from pycxl.testbed import progress

    seconds: dict[str, float] = {}
    for workdir in workdirs:  # a later run's figure replaces an earlier one's
        run: dict[str, float] = {}
        for rec in progress.outcomes(workdir):
            run[rec["nodeid"]] = run.get(rec["nodeid"], 0.0) + float(rec.get("duration_s", 0.0))
        seconds.update({k: round(v, 1) for k, v in run.items()})
    return seconds


if __name__ == "__main__":
    known = recorded_durations()
    known.update(record_durations(Path(p) for p in sys.argv[1:]))
    DURATIONS.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")
    print(f"{len(known)} units in {DURATIONS.name}")
