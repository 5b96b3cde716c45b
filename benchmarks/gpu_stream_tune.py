"""Launch shapes for the GPU STREAM kernels: triad bandwidth per (block, blocks per SM).

python3 benchmarks/gpu_stream_tune.py [--size 1G]
"""

from __future__ import annotations

import argparse
import sys

from pycxl.bench.gpu_stream import measure_gpu_bandwidth
from pycxl.units import parse_size


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1G")
    size = parse_size(ap.parse_args().size)
    for block in (256, 512, 1024):
        for per_sm in (2, 4, 8, 16, 32):
            r = measure_gpu_bandwidth("gpu0", kernel="triad", size=size, ntimes=10,
                                      block=block, blocks_per_sm=per_sm)[0]  # fmt: skip
            tbs = r.figures["bytes_per_s"] / 1e12
            print(f"block {block:4d} x {per_sm:2d}/SM: triad {tbs:.3f} TB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
