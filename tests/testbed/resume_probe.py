"""Run in the testbed guest by test_harness.py (not collected on the host: the name does
not match test_*.py). A walk-through's second step stops the guest the first time it
runs, as an emulator crash would; the harness boots again and the session resumes: the
finished test is not run again, the walk-through runs again from its first step. A test
that stops the guest every time it runs is given up after two boots (it fails, saying
why) and the test after it still runs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

GUEST_STATE = Path("/tmp/walk-step-1")  # the guest's own memory: gone with a reboot


def _power_off() -> None:
    os.sync()
    Path("/proc/sys/kernel/sysrq").write_text("1")
    Path("/proc/sysrq-trigger").write_text("o")  # power off now, like a crash


@dataclass(frozen=True)
class Step:
    """Shaped like a docs example: testbed steps of one doc build on each other."""

    doc: str
    line: int
    where: str = "testbed"


def test_finishes_in_the_first_boot() -> None:
    assert os.environ.get("PYCXL_IN_TESTBED") == "1"


@pytest.mark.parametrize("ex", [Step("probe.md", n) for n in (1, 2, 3)], ids=str)
def test_walk(ex: Step) -> None:
    marker = Path(os.environ["PYCXL_TESTBED_WORKDIR"]) / "stopped-once"
    if ex.line == 1:
        GUEST_STATE.write_text("")
    elif ex.line == 2 and not marker.exists():
        marker.write_text("")
        _power_off()
        raise AssertionError("the guest did not stop")
    elif ex.line == 3:
        assert GUEST_STATE.exists(), "step 1 did not run again in this boot"


def test_runs_after_the_stop() -> None:
    assert (Path(os.environ["PYCXL_TESTBED_WORKDIR"]) / "stopped-once").exists()


def test_stops_the_guest_every_time() -> None:
    _power_off()
    raise AssertionError("the guest did not stop")


def test_runs_after_the_one_given_up() -> None:
    assert os.environ.get("PYCXL_IN_TESTBED") == "1"
