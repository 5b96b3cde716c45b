"""Host<->GPU copies: pycxl against PyTorch's copy_, side by side in one run.

    python3 benchmarks/transfer_vs_torch.py [--size 1G] [--target dram0]

PyTorch: a pinned (pin_memory=True) or pageable uint8 tensor copied with copy_ to/from a
CUDA tensor, timed by CUDA events around each copy, best of 20 after two. pycxl:
`bench.measure_transfer` (host buffer on the target node): pinned (registered), and pageable
through the staged copier (timed by the host clock around the whole copy). Goals:
pinned >= 0.98x PyTorch's pinned copy; staged >= 3x PyTorch's pageable copy.
"""

from __future__ import annotations

import argparse
import sys

import torch

from pycxl import bench
from pycxl.base.units import parse_size


def torch_copy(size: int, direction: str, pinned: bool, n: int = 20) -> float:
    host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    src, dst = (host, dev) if direction == "h2d" else (dev, host)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(2):
        dst.copy_(src, non_blocking=pinned)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(n):
        start.record()
        dst.copy_(src, non_blocking=pinned)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return size / (best / 1e3)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1G")
    ap.add_argument("--target", default="dram0")
    a = ap.parse_args()
    size = parse_size(a.size)
    torch.cuda.init()
    pinned = bench.measure_transfer("gpu0", a.target, size=size)
    ours = {r.direction: r.bytes_per_s for r in pinned}
    pageable = bench.measure_transfer("gpu0", a.target, size=size, memory="staged")
    staged = {r.direction: r.bytes_per_s for r in pageable}
    for d in ("h2d", "d2h"):
        theirs = torch_copy(size, d, pinned=True)
        print(f"{d} pinned: pycxl {ours[d] / 1e9:.2f} GB/s, torch {theirs / 1e9:.2f} GB/s, "
              f"ratio {ours[d] / theirs:.3f}")  # fmt: skip
        theirs = torch_copy(size, d, pinned=False)
        print(f"{d} pageable: pycxl staged {staged[d] / 1e9:.2f} GB/s, torch "
              f"{theirs / 1e9:.2f} GB/s, ratio {staged[d] / theirs:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
