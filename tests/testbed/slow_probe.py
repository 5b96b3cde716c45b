"""Run in the testbed guest by test_harness.py (not collected on the host: the name does
not match test_*.py). A guest slowed on purpose, busy all the while (so the emulator uses
CPU time, the harness's measure): two steps that each take 0.6 of the harness's progress
limit (together longer than it: the limit must follow progress, not the boot), then a
test that is slow once, past the limit (as a test on a busy host may be): the harness
ends that boot and boots again, and the session resumes there."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

LIMIT_S = float(os.environ.get("PYCXL_PROBE_STALL_S", "60"))


def _busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.parametrize("step", [1, 2])
def test_slow_step(step: int) -> None:
    _busy(LIMIT_S * 0.6)


def test_slow_once() -> None:
    marker = Path(os.environ["PYCXL_TESTBED_WORKDIR"]) / "slow-once"
    if not marker.exists():
        marker.write_text("")
        os.sync()
        _busy(LIMIT_S * 20)  # the harness ends the boot long before this


def test_runs_after_the_slow_one() -> None:
    assert (Path(os.environ["PYCXL_TESTBED_WORKDIR"]) / "slow-once").exists()
