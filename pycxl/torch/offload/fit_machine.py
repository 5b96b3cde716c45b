"""The rates a training plan needs, measured on this machine in a second or two each, as
offload_model's set-up measures its own: the CPU's fused Adam step on the tier's memory,
the pinned copies between HBM and the tier, and the GPU's bf16 matrix multiply."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from .._import import import_torch
from .adam import AdamSettings, CpuAdam
from .fit import Machine
from .host_memory import HostAlloc

UPDATE_PARAMS = 1 << 24  # 256 MiB of state and weights: past the caches, a block's size
COPY_BYTES = 1 << 28
GEMM_SIDE = 8192


def cpu_update_rate(host_alloc: HostAlloc, cpus: Sequence[int]) -> float:
    """Parameters per second of the fused CPU Adam step (bf16 gradients and weights, fp32
    state) on memory from ``host_alloc``, on threads pinned to ``cpus``: the better of
    three, the first warming the pages."""
    torch = import_torch()
    n = UPDATE_PARAMS
    state = host_alloc(3 * n * 4, False).view(torch.float32).zero_()
    grads = host_alloc(n * 2, False).view(torch.bfloat16).zero_()
    weights = host_alloc(n * 2, False).view(torch.bfloat16)
    parts = (state[:n], state[n : 2 * n], state[2 * n :])
    settings = AdamSettings(0.0, (0.9, 0.999), 1e-8, 0.0, True, False)  # changes nothing
    adam = CpuAdam(cpus)
    try:
        best = float("inf")
        for _ in range(3):
            began = time.perf_counter()
            adam.step(parts, grads, weights, 1, settings)
            best = min(best, time.perf_counter() - began)
    finally:
        adam.close()
    return n / best


def link_rate(host_alloc: HostAlloc, device: Any) -> float:
    """Bytes per second of pinned copies between ``device``'s memory and memory from
    ``host_alloc``: the slower direction, each the best of three."""
    torch = import_torch()
    host = host_alloc(COPY_BYTES, True)
    dev = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    rates = []
    for dst, src in ((host, dev), (dev, host)):
        best = 0.0
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            best = max(best, COPY_BYTES / (start.elapsed_time(end) / 1e3))
        rates.append(best)
    return min(rates)


def gpu_flops(device: Any) -> float:
    """FLOPs per second of a bf16 matrix multiply of 8192 a side on ``device``: the best
    of three after one to warm up (what large layers' GEMMs sustain)."""
    torch = import_torch()
    a = torch.randn(GEMM_SIDE, GEMM_SIDE, dtype=torch.bfloat16, device=device)
    b = torch.randn_like(a)
    torch.matmul(a, b)
    best = 0.0
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b)
        end.record()
        end.synchronize()
        best = max(best, 2 * GEMM_SIDE**3 / (start.elapsed_time(end) / 1e3))
    return best


def read_machine(
    tier: str,
    tier_free: int,
    host_alloc: HostAlloc,
    cpus: Sequence[int],
    device: Any = None,
    *,
    hbm_free: int | None = None,
    link: float | None = None,
    cpu_update: float | None = None,
    flops: float | None = None,
) -> Machine:
    """The machine as the plan needs it: what is given, and the rest measured here
    (HBM's free bytes and the GPU's rates only where ``device`` is a CUDA device)."""
    if cpu_update is None:
        cpu_update = cpu_update_rate(host_alloc, cpus)
    if device is not None:
        torch = import_torch()
        if hbm_free is None:
            hbm_free = int(torch.cuda.mem_get_info(device)[0])
        link = link_rate(host_alloc, device) if link is None else link
        flops = gpu_flops(device) if flops is None else flops
        torch.cuda.empty_cache()  # what the measurements took goes back to the driver
    return Machine(tier, hbm_free, tier_free, link, cpu_update, flops)
