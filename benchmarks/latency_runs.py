"""pycxl's idle latency, repeated: best, median and run-to-run spread of latency_ns.

    python3 benchmarks/latency_runs.py [--target dram0] [--size 1G] [--page-size 4k] [--runs 5]

Compare with multichase over the same arena and page size
(`multichase -m 1g` or `multichase -m 1g -H`); the goal: within 3%, spread under 3%.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from pycxl.bench.latency import measure_latency
from pycxl.units import parse_size


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="dram0")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--page-size", default="4k")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    lat = [
        measure_latency(a.target, size=parse_size(a.size), page=a.page_size).figures["latency_ns"]
        for _ in range(a.runs)
    ]
    spread = (max(lat) - min(lat)) / statistics.median(lat)
    print(
        f"{a.target} {a.size} {a.page_size}: latency_ns per run "
        f"{' '.join(f'{x:.1f}' for x in lat)}; best {min(lat):.1f}, median "
        f"{statistics.median(lat):.1f}, spread {100 * spread:.1f}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
