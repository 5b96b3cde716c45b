"""GPU reads and writes of tier memory against the pinned copy of the same run (on the
GPU machine; dram0 stands for the tier): a 1 GiB CUDA tensor on the tier (pycxl.on_tier)
read by a GPU kernel in place (sum), written in place (fill), and copied to and from HBM;
bf16 weights on the tier read in place by a batch-1 linear (cuBLAS's GEMV, as a token of
inference reads spilled weights; an MLP's up and down projections of a model of width
8192); beside them torch's pinned h2d/d2h copy_ of 1 GiB. Best of 10, CUDA events.

    python3 benchmarks/tier_tensors.py [TIER]
"""

from __future__ import annotations

import sys

import torch

import pycxl

GiB = 1 << 30


def best_gbs(fn, nbytes: int, runs: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3)
    return nbytes / best / 1e9


def main() -> None:
    tier = sys.argv[1] if len(sys.argv) > 1 else "dram0"
    n = GiB // 4
    hbm = torch.empty(n, dtype=torch.float32, device="cuda")
    pinned = torch.empty(n, dtype=torch.float32, pin_memory=True)
    with pycxl.on_tier(tier):
        t = torch.ones(n, dtype=torch.float32, device="cuda")
        up = torch.full((22528, 8192), 0.01, dtype=torch.bfloat16, device="cuda")
        down = torch.full((8192, 22528), 0.01, dtype=torch.bfloat16, device="cuda")
    x_in = torch.ones(1, 8192, dtype=torch.bfloat16, device="cuda")
    x_mid = torch.ones(1, 22528, dtype=torch.bfloat16, device="cuda")
    weight_bytes = up.numel() * up.element_size()
    rows = {
        "pinned h2d copy_ (torch)": best_gbs(lambda: hbm.copy_(pinned, non_blocking=True), GiB),
        "pinned d2h copy_ (torch)": best_gbs(lambda: pinned.copy_(hbm, non_blocking=True), GiB),
        f"{tier} tensor read in place (sum)": best_gbs(lambda: t.sum(), GiB),
        f"{tier} tensor written in place (fill_)": best_gbs(lambda: t.fill_(2.0), GiB),
        f"{tier} -> HBM copy_": best_gbs(lambda: hbm.copy_(t), GiB),
        f"HBM -> {tier} copy_": best_gbs(lambda: t.copy_(hbm), GiB),
        f"{tier} weight, batch-1 linear (8192 -> 22528)": best_gbs(
            lambda: torch.nn.functional.linear(x_in, up), weight_bytes
        ),
        f"{tier} weight, batch-1 linear (22528 -> 8192)": best_gbs(
            lambda: torch.nn.functional.linear(x_mid, down), weight_bytes
        ),
    }
    h2d = rows["pinned h2d copy_ (torch)"]
    d2h = rows["pinned d2h copy_ (torch)"]
    for name, gbs in rows.items():
        ref = d2h if ("written" in name or name.startswith("HBM ->")) else h2d
        print(f"{name:40s} {gbs:7.2f} GB/s  {gbs / ref:5.3f}x pinned")
    print("tier pool:", pycxl.tier_pool(tier).stats())


if __name__ == "__main__":
    main()
