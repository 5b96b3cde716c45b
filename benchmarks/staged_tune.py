"""The staged pageable copy's shape: bandwidth per (chunk, copy threads), both ways.

    python3 benchmarks/staged_tune.py [--size 1G]

Source and destination are pageable buffers on the GPU's nearest node, touched first;
each figure is the best of 5 copies timed by the host clock around the whole copy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from pycxl.gpu.memory import DeviceMemory, GpuContext
from pycxl.gpu.staged import StagedCopier
from pycxl.system import snapshot
from pycxl.units import parse_size


def best_rate(fn: object, size: int) -> float:
    times = []
    for _ in range(6):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return size / min(times[1:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1G")
    size = parse_size(ap.parse_args().size)
    s = snapshot()
    g = s.gpus.devices[0]
    node = next(n.node for n in s.nodes if n.node.id == g.numa_node)
    cpus = [c for c in node.cpus if c in os.sched_getaffinity(0)]
    ctx = GpuContext(g.ordinal)
    dev = DeviceMemory(ctx, size)
    host = np.ones(size, dtype=np.uint8)
    for chunk in (8 << 20, 16 << 20, 32 << 20, 64 << 20):
        for threads in (4, 8, 12, 16):
            if threads > len(cpus):
                continue
            with StagedCopier(ctx, chunk=chunk, cpus=cpus[:threads], node=g.numa_node) as c:
                h2d = best_rate(lambda c=c: c.to_device(dev.ptr, host), size)
                d2h = best_rate(lambda c=c: c.to_host(host, dev.ptr), size)
            print(f"chunk {chunk >> 20:3d} MiB, {threads:2d} threads: "
                  f"h2d {h2d / 1e9:.2f} GB/s, d2h {d2h / 1e9:.2f} GB/s", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
