"""Launch shapes for the GPU STREAM kernels: triad bandwidth per (unroll, block, blocks
per SM), where 0 blocks per SM means one block per 256 * unroll pairs (no grid stride).

    python3 benchmarks/gpu_stream_tune.py [--size 1G]
"""

from __future__ import annotations

import argparse
import sys

from pycxl.base.units import parse_size
from pycxl.measure.gpu_stream import gpu_stream_bandwidth
from pycxl.resolve.system import snapshot


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1G")
    size = parse_size(ap.parse_args().size)
    gpu = snapshot().gpu("gpu0")
    best = (0.0, "")
    for unroll in (1, 2, 4):
        for block in (256, 512):
            for per_sm in (4, 8, 16, 32, 0):
                r = gpu_stream_bandwidth(gpu, kernel="triad", size=size, samples=9,
                                         block=block, blocks_per_sm=per_sm,
                                         unroll=unroll)[0]  # fmt: skip
                tbs = r.bytes_per_s / 1e12
                shape = f"unroll {unroll} block {block:4d} x {per_sm:2d}/SM (grid {r.grid})"
                print(f"{shape}: triad {tbs:.3f} TB/s")
                best = max(best, (tbs, shape))
    print(f"best: {best[1]}: {best[0]:.3f} TB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
