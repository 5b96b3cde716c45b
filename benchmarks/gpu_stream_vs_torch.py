"""On-GPU STREAM: pycxl's PTX STREAM against PyTorch, side by side in one run.

    python3 benchmarks/gpu_stream_vs_torch.py [--size 1G]

PyTorch: triad `torch.add(b, c, alpha=s, out=a)` and copy `a.copy_(b)` on fp64 arrays of
--size bytes each, CUDA events around each call, best of 20 after one. Goal: triad
>= 1.0x.
"""

from __future__ import annotations

import argparse
import sys

import torch

from pycxl.base.units import parse_size
from pycxl.measure.gpu_stream import gpu_stream_bandwidth
from pycxl.resolve.system import snapshot


def torch_best(fn: object, nbytes: int, n: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()  # type: ignore[operator]
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(n):
        start.record()
        fn()  # type: ignore[operator]
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return nbytes / (best / 1e3)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1G")
    size = parse_size(ap.parse_args().size)
    n = size // 8
    a, b, c = (torch.full((n,), v, dtype=torch.float64, device="cuda") for v in (1.0, 2.0, 0.0))
    theirs = {
        "triad": torch_best(lambda: torch.add(b, c, alpha=3.0, out=a), 24 * n),
        "copy": torch_best(lambda: a.copy_(b), 16 * n),
    }
    ours = {r.kernel: r.bytes_per_s
            for r in gpu_stream_bandwidth(snapshot().gpu("gpu0"), size=size)}  # fmt: skip
    for k in ("triad", "copy"):
        print(f"{k}: pycxl {ours[k] / 1e12:.3f} TB/s, torch {theirs[k] / 1e12:.3f} TB/s, "
              f"ratio {ours[k] / theirs[k]:.3f}")  # fmt: skip
    for k in ("scale", "add"):
        print(f"{k}: pycxl {ours[k] / 1e12:.3f} TB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
