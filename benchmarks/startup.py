"""How long pycxl's quick commands take, as ratios to a bare interpreter start, in one run.

    python3 benchmarks/startup.py [--runs 20]

Runs `python -c pass` (this interpreter) and each command through the installed
console script alternately, so machine noise hits both alike, and prints each median
and its ratio to the bare start. Goal: every ratio <= 4 (a health check at the top of
every job script must not cost more).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TREE = Path(__file__).resolve().parents[1] / "tests" / "data" / "trees" / "two-dev" / "region"
GOAL = 4.0


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    # the console script of this interpreter's environment (not a wrapper found on PATH)
    beside = Path(sys.executable).parent / "pycxl"
    pycxl = str(beside) if beside.exists() else shutil.which("pycxl") or "pycxl"
    bare = [sys.executable, "-c", "pass"]
    commands = {
        "pycxl list": [pycxl, "list"],
        "pycxl list --json": [pycxl, "list", "--json"],
        "pycxl list (recorded CXL tree)": [pycxl, "list", "--sysroot", str(TREE)],
        "pycxl --help": [pycxl, "--help"],
        "pycxl check": [pycxl, "check"],
        "pycxl check (recorded CXL tree)": [pycxl, "check", "--sysroot", str(TREE)],
    }
    if subprocess.run([pycxl, "check", "--help"], capture_output=True).returncode != 0:
        del commands["pycxl check"]  # not in this version
        del commands["pycxl check (recorded CXL tree)"]
    for cmd in (bare, *commands.values()):
        timed(cmd)  # warm the page cache
    times: dict[str, list[float]] = {name: [] for name in ["python -c pass", *commands]}
    for _ in range(args.runs):
        for name, cmd in [("python -c pass", bare), *commands.items()]:
            times[name].append(timed(cmd))
    print(f"{pycxl} (interpreter {sys.executable})")
    base = statistics.median(times["python -c pass"])
    print(f"{'python -c pass':32} median {base * 1000:6.1f} ms over {args.runs} runs")
    worst = 0.0
    for name in commands:
        m = statistics.median(times[name])
        worst = max(worst, m / base)
        print(f"{name:32} median {m * 1000:6.1f} ms  {m / base:5.2f}x")
    print(f"worst ratio {worst:.2f}x (goal <= {GOAL:g}x)")
    return 0 if worst <= GOAL else 1


if __name__ == "__main__":
    raise SystemExit(main())
