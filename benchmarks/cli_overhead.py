"""What the CLI adds to a benchmark beyond the measurement itself.

    python3 benchmarks/cli_overhead.py [--runs 5]

Runs `pycxl bench latency --target dram0 --size 64M --samples 3 --json` and subtracts
the measurement's own time (`measure_s`, from placement to the last sample) from the
command's wall time: interpreter start, imports, target resolution and output. Goal: 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    cmd = [sys.executable, "-m", "pycxl.cli.main", "bench", "latency", "--target", "dram0",
           "--size", "64M", "--samples", "3", "--json"]  # fmt: skip
    over = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        wall = time.perf_counter() - t0
        over.append(wall - json.loads(out)[0]["measure_s"])
    print(
        f"CLI overhead per run (s): {' '.join(f'{x:.3f}' for x in over)}; "
        f"median {statistics.median(over):.3f} s (goal <= 0.5 s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
