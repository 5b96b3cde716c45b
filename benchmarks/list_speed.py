"""How long `pycxl list` takes, as a ratio to a bare interpreter start, in one run.

    python3 benchmarks/list_speed.py [--runs 30] [--sysroot TREE]

Runs `python3 -c pass` and `pycxl list --sysroot TREE` alternately (so machine noise
hits both alike) and prints the medians and their ratio. Goal: ratio <= 5.
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


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--sysroot", default=str(TREE))
    args = ap.parse_args()
    pycxl = shutil.which("pycxl") or str(Path(sys.executable).parent / "pycxl")
    bare_cmd = [sys.executable, "-c", "pass"]
    list_cmd = [pycxl, "list", "--sysroot", args.sysroot]
    timed(bare_cmd), timed(list_cmd)  # warm the page cache
    bare, listing = [], []
    for _ in range(args.runs):
        bare.append(timed(bare_cmd))
        listing.append(timed(list_cmd))
    b, lst = statistics.median(bare), statistics.median(listing)
    print(f"python3 -c pass : median {b * 1000:.1f} ms over {args.runs} runs")
    print(f"pycxl list      : median {lst * 1000:.1f} ms over {args.runs} runs ({args.sysroot})")
    print(f"ratio           : {lst / b:.2f}x (goal <= 5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
