"""A STREAM run under pycxl top, shared by the tests on this machine and in the testbed."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pycxl
from pycxl.ops.top import TopReport

PR_SET_THP_DISABLE = 41  # linux/prctl.h: no transparent huge pages, across fork and exec
BASE_PAGES = (f"import ctypes, os, sys; ctypes.CDLL(None).prctl({PR_SET_THP_DISABLE}, 1, 0, 0, 0); "
              "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")  # fmt: skip


def bandwidth_under_top(target: str, size: str, interval: float) -> tuple[list[TopReport], Any]:
    """``pycxl bench bandwidth`` (one pass of STREAM copy, one thread) on ``target`` in
    another process, watched by top (as with -p) from before it starts until it ends
    (the reports end by themselves then); the reports and the bench's result. The bench
    runs on base pages (PR_SET_THP_DISABLE, then exec: the same process), so each page
    it touches is one allocation in its node's counters."""
    bench = subprocess.Popen(
        [sys.executable, "-c", BASE_PAGES, "-m", "pycxl.cli.main", "bench", "bandwidth", "-t",
         target, "--size", size, "-n", "1", "--threads", "1", "--kernel", "copy", "--json"],
        stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        reports = list(pycxl.top(interval, 10_000, bench.pid))
    finally:
        out, _ = bench.communicate(timeout=600)
    assert bench.returncode == 0
    assert reports and reports[-1].process is not None and reports[-1].process.exited
    return reports, json.loads(out)[0]
