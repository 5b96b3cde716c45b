"""Idle latency: pycxl against multichase, side by side, round after round.

    python3 benchmarks/latency_vs_multichase.py --multichase PATH [--target dram0]
        [--size 1G] [--page-size 4k|2m] [--rounds 5]

Both chase the same arena size and page size (multichase -m SIZE, -H for 2m; pycxl
--page-size) from the same CPU (the first CPU of the node nearest the target), with
memory bound to the target (multichase under `pycxl run --membind`, its affinity set to
that CPU). Each round runs multichase (best of 5 half-second samples) then pycxl (best
of 7 samples). Prints each round, then each tool's best and median round, their ratios
(goal: within 3%), and each tool's run-to-run spread, (max - min) / median (goal: under
3%).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from pycxl import bench
from pycxl.base.units import parse_size
from pycxl.resolve.system import snapshot


def multichase(binary: str, target: str, cpu: int, size: str, page: str) -> float:
    cmd = [sys.executable, "-m", "pycxl.cli.main", "run", "--membind", target, "--",
           binary, "-m", size.lower(), "-n", "5"]  # fmt: skip
    if page == "2m":
        cmd.append("-H")
    # cwd: away from a source tree, where `-m pycxl...` would find the uninstalled package
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=tempfile.gettempdir(),
                       preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))  # fmt: skip
    if p.returncode != 0:
        raise SystemExit(f"multichase failed ({p.returncode}): {p.stderr.strip()}")
    return float(p.stdout.split()[-1])


def spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / statistics.median(xs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--multichase", required=True)
    ap.add_argument("--target", default="dram0")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--page-size", default="4k")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    system = snapshot(gpus=False)
    cpu = system.pair(a.target).cpus[0]
    theirs, ours = [], []
    for r in range(a.rounds):
        theirs.append(multichase(a.multichase, a.target, cpu, a.size, a.page_size))
        (res,) = bench.measure_latency(a.target, f"cpu{cpu}", size=parse_size(a.size),
                                       page=a.page_size, system=system)  # fmt: skip
        ours.append(res.latency_ns)
        print(f"round {r + 1}: multichase {theirs[-1]:.1f} ns, pycxl {ours[-1]:.1f} ns, "
              f"ratio {ours[-1] / theirs[-1]:.3f}", flush=True)  # fmt: skip
    med_t, med_o = statistics.median(theirs), statistics.median(ours)
    print(f"{a.size} {a.page_size} on {a.target} from cpu{cpu}: best multichase "
          f"{min(theirs):.1f} ns, pycxl {min(ours):.1f} ns, ratio {min(ours) / min(theirs):.3f}; "
          f"median multichase {med_t:.1f} ns, pycxl {med_o:.1f} ns, ratio {med_o / med_t:.3f}; "
          f"spread multichase {spread(theirs):.1%}, pycxl {spread(ours):.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
