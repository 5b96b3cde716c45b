"""Pinned memory on a tier: pycxl against PyTorch's own pinned memory, and the staged
copier against pinned copies, side by side in one run, in rounds.

    python3 benchmarks/pinned_vs_torch.py [--size 1G] [--target dram0] [--rounds 3] [--tune]

Each round, in alternating order: a `pycxl.pinned_tensor` on the target and
`torch.empty(..., pin_memory=True)`, each copied to and from a CUDA tensor with
`copy_(non_blocking=True)`, timed by CUDA events, 20 copies after 2 (best and median);
then `pycxl bench transfer` pinned and staged (medians). Goals: pinned tensor >= 0.98x
torch's pinned copy; staged >= 0.9x the pinned median, both ways, in every round.
`--tune` adds a sweep of the staged copier's shape (chunk, depth, threads), medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import pycxl
from pycxl import bench
from pycxl.base.units import parse_size
from pycxl.gpu.context import GpuContext
from pycxl.gpu.memory import DeviceMemory
from pycxl.gpu.staged import StagedCopier
from pycxl.numa.placement import pages_by_node

SAMPLES = 20


def copy_rates(host: torch.Tensor, n: int = SAMPLES) -> dict[str, tuple[float, float]]:
    """(best, median) bytes/s of h2d and d2h non_blocking copies of ``host``."""
    dev = torch.empty_like(host, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = {}
    for direction, (dst, src) in {"h2d": (dev, host), "d2h": (host, dev)}.items():
        for _ in range(2):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        ms = []
        for _ in range(n):
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            ms.append(start.elapsed_time(end))
        size = host.numel() * host.element_size()
        out[direction] = (size / (min(ms) / 1e3), size / (statistics.median(ms) / 1e3))
    return out


def tune(size: int, target: str) -> None:
    s = pycxl.snapshot()
    g = s.gpu("gpu0")
    cpus = list(s.copy_cpus(g, 64))
    ctx = GpuContext.of(g)
    dev = DeviceMemory(ctx, size)
    host = pycxl.allocate(size, target)
    for chunk in (8 << 20, 16 << 20, 32 << 20):
        for depth in (3, 4):
            for threads in (12, 16):
                for nt_host, nt_dev in ((False, False), (True, False), (True, True)):
                    if threads > len(cpus):
                        continue
                    with StagedCopier(ctx, chunk=chunk, depth=depth, cpus=cpus[:threads],
                                      node=g.numa_node, nt_to_host=nt_host,
                                      nt_to_device=nt_dev) as c:  # fmt: skip
                        rates = {}
                        for d, fn in (("h2d", lambda c=c: c.to_device(dev, host)),
                                      ("d2h", lambda c=c: c.to_host(host, dev))):  # fmt: skip
                            times = []
                            for _ in range(12):
                                t0 = time.perf_counter()
                                fn()
                                times.append(time.perf_counter() - t0)
                            rates[d] = size / statistics.median(times[2:]) / 1e9
                    print(f"tune chunk {chunk >> 20:2d} MiB depth {depth} threads {threads:2d} "
                          f"nt host {int(nt_host)} device {int(nt_dev)}: h2d {rates['h2d']:.2f} "
                          f"d2h {rates['d2h']:.2f} GB/s (medians)", flush=True)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1G")
    ap.add_argument("--target", default="dram0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tune", action="store_true")
    a = ap.parse_args()
    size = parse_size(a.size)
    torch.cuda.init()
    ours = pycxl.pinned_tensor(size, torch.uint8, a.target)
    theirs = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    ours.fill_(1)
    theirs.fill_(1)
    node = pycxl.snapshot(gpus=False).resolve(a.target).node
    placed = pages_by_node(ours.numpy())
    print(f"pinned tensor: is_pinned {ours.is_pinned()}, pages by node {placed} "
          f"(target node {node})")  # fmt: skip
    worst = {"pinned": 9.0, "staged": 9.0}
    for r in range(a.rounds):
        order = [("pycxl", ours), ("torch", theirs)]
        if r % 2:
            order.reverse()
        got = {name: copy_rates(t) for name, t in order}
        for d in ("h2d", "d2h"):
            (ob, om), (tb, tm) = got["pycxl"][d], got["torch"][d]
            worst["pinned"] = min(worst["pinned"], ob / tb, om / tm)
            print(f"round {r + 1} {d} pinned tensor: pycxl best {ob / 1e9:.2f} median "
                  f"{om / 1e9:.2f} GB/s | torch best {tb / 1e9:.2f} median {tm / 1e9:.2f} "
                  f"| ratio best {ob / tb:.3f} median {om / tm:.3f}", flush=True)  # fmt: skip
        pinned = {x.direction: x for x in bench.measure_transfer("gpu0", a.target, size=size)}
        staged = {x.direction: x for x in bench.measure_transfer("gpu0", a.target, size=size,
                                                                 memory="staged")}  # fmt: skip
        for d in ("h2d", "d2h"):
            ratio = staged[d].bytes_per_s_median / pinned[d].bytes_per_s_median
            worst["staged"] = min(worst["staged"], ratio)
            print(f"round {r + 1} {d} staged: median {staged[d].bytes_per_s_median / 1e9:.2f} "
                  f"(best {staged[d].bytes_per_s / 1e9:.2f}) GB/s vs pinned median "
                  f"{pinned[d].bytes_per_s_median / 1e9:.2f} GB/s | ratio {ratio:.3f}",
                  flush=True)  # fmt: skip
    print(f"worst pinned-tensor ratio {worst['pinned']:.3f} (goal >= 0.98); worst staged/"
          f"pinned-median ratio {worst['staged']:.3f} (goal >= 0.9)")  # fmt: skip
    if a.tune:
        tune(size, a.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
