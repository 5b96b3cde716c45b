"""How the session splits the testbed's work into boots (tests/guests.py): by recorded
seconds, longest first, a walk-through whole, each boot's tests in the session's order,
and a small topology in one boot."""

from __future__ import annotations

import threading

from tests.guests import BATCH_S, Batch, GuestRuns, plan_batches


def test_a_big_topology_is_split_evenly_and_a_walk_through_stays_whole() -> None:
    units = [(f"t{i}", [f"t{i}"]) for i in range(6)] + [
        ("walk-through a.md", ["a:1", "a:2", "a:3"])
    ]
    seconds = {f"t{i}": 100.0 for i in range(6)} | {"a:1": 150.0, "a:2": 150.0, "a:3": 150.0}
    batches = plan_batches({"two-dev": units, "four-dev": [("x", ["x"])]}, seconds, guests=2)
    big = [b for b in batches if b.topology == "two-dev"]
    loads = sorted(b.seconds for b in big)
    assert len(big) == 2 and sum(loads) == 1050.0 and loads[1] - loads[0] <= 100.0  # one unit
    walk = next(b for b in big if "a:1" in b.nodeids)
    assert [n for n in walk.nodeids if n.startswith("a:")] == ["a:1", "a:2", "a:3"]
    order = [n for _, ids in units for n in ids]
    for b in big:  # each boot runs its tests in the session's order
        assert list(b.nodeids) == [n for n in order if n in b.nodeids]
    assert sorted(n for b in big for n in b.nodeids) == sorted(order)
    assert [b.topology for b in batches][-1] == "four-dev"  # longest first
    assert batches[-1].nodeids == ("x",)  # unknown units count as UNKNOWN_S: one boot


def test_work_under_a_boot_is_not_split_and_one_guest_means_one_boot() -> None:
    units = [(f"t{i}", [f"t{i}"]) for i in range(4)]
    small = plan_batches({"t": units}, dict.fromkeys(["t0", "t1", "t2", "t3"], 20.0), guests=2)
    assert len(small) == 1
    big = plan_batches({"t": units}, dict.fromkeys(["t0", "t1", "t2", "t3"], BATCH_S), guests=1)
    assert len(big) == 1 and len(big[0].nodeids) == 4


def test_closing_the_session_stops_the_boots_still_running() -> None:
    started, stopped = threading.Event(), threading.Event()

    def run(batch: Batch, stop: threading.Event) -> dict[str, object]:
        started.set()
        if stop.wait(timeout=30):
            stopped.set()
        return {"__said__": "stopped"}

    runs = GuestRuns([Batch("two-dev", ("a",), 1.0)], run)
    assert started.wait(timeout=30)
    runs.close()
    assert stopped.is_set()
