"""pycxl's STREAM kernels against likwid-bench, side by side in one run.

    python3 benchmarks/stream_vs_likwid.py [--target dram0] [--threads N] [--size 512M]

Same node, threads and array size for both; likwid-bench's kernels: stream_avx (triad)
and copy_avx, or the widest the CPU supports. likwid-bench counts bytes as STREAM does
(triad: 3 x 8 bytes per element, no write-allocate) and reports the mean over its
iterations, so pycxl's median is printed beside its best, and both ratios.
The goals: triad and copy >= 0.98x, and pycxl's --nt-stores triad above likwid's triad.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys

from pycxl.base.units import parse_size
from pycxl.measure.bandwidth import stream_bandwidth
from pycxl.measure.targets import Pair
from pycxl.resolve.system import snapshot


def likwid(kernel: str, node: int, threads: int, array: int, cpus: list[int]) -> float:
    """likwid-bench's MByte/s for `kernel`, working set = 3 (or 2) arrays on `node`."""
    streams = 2 if kernel.startswith("copy") else 3
    total_kb = streams * array // 1024
    cpu_list = ",".join(map(str, cpus[:threads]))
    cmd = ["likwid-bench", "-t", kernel, "-w", f"M{node}:{total_kb}kB:{threads}:1:1", "-i", "20"]
    # pin explicitly: the workgroup's domain is the node; threads on the given CPUs
    cmd = ["taskset", "-c", cpu_list, *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = re.search(r"MByte/s:\s+([\d.]+)", out)
    if not m:
        sys.exit(f"cannot read likwid-bench output:\n{out}")
    return float(m.group(1)) * 1e6


def widest(candidates: list[str]) -> str:
    out = subprocess.run(["likwid-bench", "-a"], capture_output=True, text=True).stdout
    names = {line.split()[0] for line in out.splitlines() if line.strip() and " - " in line}
    return next((c for c in candidates if c in names), candidates[-1])


def one_round(args: argparse.Namespace, p: Pair, threads: int, array: int,
              kernels: dict[str, str]) -> dict[str, float]:  # fmt: skip
    """pycxl (best of 20 passes; plain, then --nt-stores triad), then likwid-bench."""
    runs = stream_bandwidth(p, threads=threads, size=array, samples=19)
    best = {r.kernel: r.bytes_per_s for r in runs}
    median = {r.kernel: r.bytes_per_s_median for r in runs}
    (nt,) = stream_bandwidth(p, threads=threads, size=array, samples=19, kernel="triad",
                             nt_stores=True)  # fmt: skip
    theirs = {k: likwid(kernels[k], p.node, threads, array, list(p.cpus)) for k in kernels}
    for k in ("triad", "copy"):
        print(
            f"{k:6s} pycxl best {best[k] / 1e9:7.2f} median {median[k] / 1e9:7.2f} GB/s | "
            f"likwid {kernels[k]} {theirs[k] / 1e9:7.2f} GB/s | ratio best "
            f"{best[k] / theirs[k]:.3f} median {median[k] / theirs[k]:.3f}"
        )
    ntb = nt.bytes_per_s
    print(f"triad --nt-stores pycxl best {ntb / 1e9:.2f} GB/s vs likwid triad "
          f"{theirs['triad'] / 1e9:.2f} GB/s | ratio {ntb / theirs['triad']:.3f}")  # fmt: skip
    return {"triad": best["triad"], "copy": best["copy"], "nt": ntb,
            "likwid triad": theirs["triad"], "likwid copy": theirs["copy"]}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="dram0")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--size", default="512M", help="bytes per array")
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds")
    args = ap.parse_args()
    if not shutil.which("likwid-bench"):
        sys.exit("likwid-bench not found: apt-get install likwid")
    p = snapshot(gpus=False).pair(args.target)
    threads = args.threads or len(p.cpus)
    array = parse_size(args.size)
    kernels = {
        "triad": widest(["stream_avx512", "stream_avx", "stream_sse", "stream"]),
        "copy": widest(["copy_avx512", "copy_avx", "copy_sse", "copy"]),
    }
    print(f"node {p.node}, {threads} thread(s), {array >> 20} MiB per array")
    rounds = []
    for r in range(args.rounds):
        print(f"round {r + 1}")
        rounds.append(one_round(args, p, threads, array, kernels))
    if args.rounds > 1:
        top = {k: max(x[k] for x in rounds) for k in rounds[0]}
        for k in ("triad", "copy"):
            ratios = [x[k] / x[f"likwid {k}"] for x in rounds]
            print(f"{k}: best of rounds pycxl {top[k] / 1e9:.2f} vs likwid "
                  f"{top[f'likwid {k}'] / 1e9:.2f} GB/s = {top[k] / top[f'likwid {k}']:.3f}; "
                  f"per-round ratios {' '.join(f'{q:.3f}' for q in ratios)}, "
                  f"median {statistics.median(ratios):.3f}")  # fmt: skip
        nt, lt = top["nt"], top["likwid triad"]
        print(f"nt triad: best of rounds {nt / 1e9:.2f} vs likwid triad {lt / 1e9:.2f} GB/s "
              f"= {nt / lt:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
