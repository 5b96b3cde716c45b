"""Layers streamed from a host tier on the GPU machine, side by side in one run: pycxl's
streaming, plain ``.to()`` from pageable memory, pinned copies without look-ahead, and
Hugging Face accelerate's ``cpu_offload`` on the same model, against the bound (the same
stack in HBM, and the bytes over the pinned bandwidth, measured in the same run).

    python3 benchmarks/offload_vs_accelerate.py --tier dram0 [--rounds 3]

Stacks: 16 bf16 Linear(8192, 8192) layers (2 GiB), link-bound (1024 tokens) and
compute-bound (16384 tokens), forward and forward+backward (accelerate: forward only,
it is an inference hook; the plain loops' backward passes in the first round only, they
take 10-25x the bound). Per round and stack: each mode's median step over 5 steps; the
table gives the median over rounds and the range.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch

import pycxl


def accelerate_step_s(tier: str, layers: int, width: int, tokens: int, samples: int) -> float:
    """accelerate.cpu_offload on the same stack, its weights first placed on the tier."""
    from accelerate import cpu_offload

    node = pycxl.snapshot(gpus=False).resolve(tier).node
    assert node is not None
    buffers = []
    modules: list[Any] = []
    for i in range(layers):
        g = torch.Generator(device="cuda").manual_seed(1 + i)
        w = (torch.randn(width, width, device="cuda", generator=g) / width**0.5).bfloat16()
        buf = pycxl.allocate(2 * width * width, tier)  # pageable, on the tier
        host = torch.from_numpy(buf.array("uint8")).view(torch.bfloat16).view(width, width)
        host.copy_(w)
        buffers.append(buf)
        lin = torch.nn.Linear(width, width, bias=False, device="meta", dtype=torch.bfloat16)
        lin.weight = torch.nn.Parameter(host, requires_grad=False)
        modules += [lin, torch.nn.ReLU()]
    model = torch.nn.Sequential(*modules)
    cpu_offload(model, execution_device=torch.device("cuda", 0))
    x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
    times = []
    with torch.no_grad():
        for k in range(2 + samples):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(x)
            torch.cuda.synchronize()
            if k >= 2:
                times.append(time.perf_counter() - t0)
    pages = sum(b.pages_by_node().get(node, 0) for b in buffers)
    assert pages == layers * 2 * width * width // 4096, "accelerate's weights left the tier"
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", default="dram0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--tokens", default="1024,16384")
    a = ap.parse_args()
    stacks = [(int(t), bw) for bw in (False, True) for t in a.tokens.split(",")]
    rows: dict[tuple[int, bool, str], list[float]] = {}
    bounds: dict[tuple[int, bool], list[float]] = {}
    for r in range(a.rounds):
        for tokens, backward in stacks:
            # the plain loops' backward passes take 10-25x the bound: measured in round 1
            modes = "hbm,pycxl" if backward and r else "hbm,pycxl,to,pinned"
            res = pycxl.bench.measure_offload(a.tier, "gpu0", layers=a.layers, width=a.width,
                                              tokens=tokens, backward=backward,
                                              modes=modes)  # fmt: skip
            for x in res:
                assert x.pages_on_node == x.pages, f"{x.mode}: pages off the tier"
                rows.setdefault((tokens, backward, x.mode), []).append(x.step_s)
                if x.mode == "pycxl":
                    print(f"round {r + 1}: {tokens} tokens, "
                          f"{'fwd+bwd' if backward else 'fwd'}: bound {1e3 * x.bound_s:.2f} ms "
                          f"(compute {1e3 * x.compute_s:.2f} ms, pinned "
                          f"{x.pinned_h2d_bytes_per_s / 1e9:.1f} / "
                          f"{x.pinned_d2h_bytes_per_s / 1e9:.1f} GB/s), streamed "
                          f"{1e3 * x.step_s:.2f} ms = {x.vs_bound:.3f}x, hidden "
                          f"{100 * (x.hidden or 0):.0f}%", flush=True)  # fmt: skip
            bound = next(x.bound_s for x in res if x.mode == "pycxl")
            bounds.setdefault((tokens, backward), []).append(bound)
            if not backward:
                s = accelerate_step_s(a.tier, a.layers, a.width, tokens, 5)
                rows.setdefault((tokens, backward, "accelerate"), []).append(s)
                print(f"round {r + 1}: {tokens} tokens, fwd: accelerate cpu_offload "
                      f"{1e3 * s:.2f} ms = {s / bound:.2f}x the bound", flush=True)  # fmt: skip
    print(
        f"\n{a.layers} x Linear({a.width}, {a.width}) bf16 on {a.tier}; step / bound per "
        f"round (bound measured in each round), median [range] over {a.rounds} rounds"
    )
    for tokens, backward in stacks:
        b = bounds[(tokens, backward)]
        print(f"{tokens} tokens, {'forward+backward' if backward else 'forward'} "
              f"(bound {1e3 * statistics.median(b):.2f} ms):")  # fmt: skip
        for mode in ("hbm", "pycxl", "pinned", "to", "accelerate"):
            steps = rows.get((tokens, backward, mode))
            if not steps:
                continue
            ratios = [s / bb for s, bb in zip(steps, b, strict=False)]  # round 1 alone, or all
            print(
                f"  {mode:10s} {1e3 * statistics.median(steps):8.2f} ms  "
                f"{statistics.median(ratios):6.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]"
            )
        acc = rows.get((tokens, backward, "accelerate"))
        if acc:
            ours = rows[(tokens, backward, "pycxl")]
            speedups = [x / y for x, y in zip(acc, ours, strict=True)]
            print(
                f"  accelerate / pycxl: {statistics.median(speedups):.2f}x "
                f"[{min(speedups):.2f}-{max(speedups):.2f}]"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
