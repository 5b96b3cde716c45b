"""Run in the testbed guest by test_harness.py (not collected on the host: the name does
not match test_*.py). One session of three boots, each of the first two cut short on
purpose, shows how the harness resumes:

- boot 1: six steps that each keep the guest busy for 0.2 of the harness's progress
  limit (together longer than it: the limit must follow progress, not the boot); then a
  walk-through's second step is slow, past the limit (as a test on a busy host may be):
  the harness ends the boot;
- boot 2: the finished tests are not run again; the walk-through runs again from its
  first step, and its second step now stops the guest, as an emulator crash would;
- boot 3: the walk-through runs again from its first step; the step that stopped two
  boots is not run a third time (it fails, saying why), and the steps and the test after
  it still run.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

LIMIT_S = float(os.environ.get("PYCXL_PROBE_STALL_S", "60"))
STEPS = 6  # busy steps of 0.2 of the limit each
GUEST_STATE = Path("/tmp/walk-step-1")  # the guest's own memory: gone with a reboot
# Readings of the clock further apart than this are time the emulator did not run the
# guest (the host ran other work); a busy loop reads the clock every few microseconds.
GAP_S = 0.001


def _workdir() -> Path:
    return Path(os.environ["PYCXL_TESTBED_WORKDIR"])


def _power_off() -> None:
    os.sync()
    Path("/proc/sys/kernel/sysrq").write_text("1")
    Path("/proc/sysrq-trigger").write_text("o")  # power off now, like a crash


def _run_for(seconds: float) -> tuple[float, float]:
    """Busy until the loop itself has run ``seconds``: time the host gave to other work
    is not counted, as the harness's clock (the emulator's CPU time) does not count it
    either. Returns (seconds run, wall seconds)."""
    start = last = time.monotonic()
    ran = 0.0
    while ran < seconds:
        now = time.monotonic()
        if now - last < GAP_S:
            ran += now - last
        last = now
    return ran, last - start


def test_finishes_in_the_first_boot() -> None:
    assert os.environ.get("PYCXL_IN_TESTBED") == "1"


@pytest.mark.parametrize("step", range(1, STEPS + 1))
def test_slow_step(step: int) -> None:
    ran, wall = _run_for(LIMIT_S * 0.2)
    with (_workdir() / "slow-steps.jsonl").open("a") as f:
        f.write(json.dumps({"step": step, "ran_s": ran, "wall_s": wall}) + "\n")


@dataclass(frozen=True)
class Step:
    """Shaped like a docs example: testbed steps of one doc build on each other."""

    doc: str
    line: int
    where: str = "testbed"


@pytest.mark.parametrize("ex", [Step("probe.md", n) for n in (1, 2, 3)], ids=str)
def test_walk(ex: Step) -> None:
    if ex.line == 1:
        GUEST_STATE.write_text("")
    elif ex.line == 2:
        slow = _workdir() / "was-slow"
        if not slow.exists():
            slow.write_text("")
            os.sync()
            _run_for(LIMIT_S * 20)  # the harness ends the boot long before this
        else:
            _power_off()
        raise AssertionError("the guest did not stop")
    elif ex.line == 3:
        assert GUEST_STATE.exists(), "step 1 did not run again in this boot"


def test_runs_after_the_walk() -> None:
    assert (_workdir() / "was-slow").exists()
