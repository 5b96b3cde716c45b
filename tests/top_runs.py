"""A STREAM run under pycxl top, shared by the tests on this machine and in the testbed."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pycxl
from pycxl.ops.top import TopReport


def bandwidth_under_top(target: str, size: str, interval: float) -> tuple[list[TopReport], Any]:
    """``pycxl bench bandwidth`` (one pass of STREAM copy, one thread) on ``target`` in
    another process, watched by top (as with -p) from before it starts until it ends
    (the reports end by themselves then); the reports and the bench's result."""
    bench = subprocess.Popen(
        [sys.executable, "-m", "pycxl.cli.main", "bench", "bandwidth", "-t", target, "--size",
         size, "-n", "1", "--threads", "1", "--kernel", "copy", "--json"],
        stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        reports = list(pycxl.top(interval, 10_000, bench.pid))
    finally:
        out, _ = bench.communicate(timeout=600)
    assert bench.returncode == 0
    assert reports and reports[-1].process is not None and reports[-1].process.exited
    return reports, json.loads(out)[0]
