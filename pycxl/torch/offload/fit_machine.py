"""The rates a training plan needs, measured on this machine in a second or two each, as
offload_model's set-up measures its own: the CPU's fused Adam step on the tier's memory,
the pinned copies between HBM and the tier, and the GPU's bf16 matrix multiply."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .._import import import_torch
from .adam import AdamSettings, CpuAdam
from .fit import Machine
from .host_memory import HostAlloc

UPDATE_PARAMS = 1 << 24  # 256 MiB of state and weights: past the caches, a block's size
COPY_BYTES = 1 << 28
SHARED_PIECE = 1 << 24  # a copy beside the CPU step: 16 MiB, a fraction of the step's time
GEMM_SIDE = 8192


Beside = Callable[[], Callable[[float], None]]  # begins work; what to call when the step ends


def cpu_update_rate(host_alloc: HostAlloc, cpus: Sequence[int],
                    beside: Beside | None = None) -> float:  # fmt: skip
    """Parameters per second of the fused CPU Adam step (bf16 gradients and weights, fp32
    state) on memory from ``host_alloc``, on threads pinned to ``cpus``: the better of
    two after one that warms the pages. ``beside``: begins work that runs while a step
    is timed, and returns what to call with the step's seconds once it is
    (``shared_rates``)."""
    torch = import_torch()
    n = UPDATE_PARAMS
    state = host_alloc(3 * n * 4, False).view(torch.float32).zero_()
    grads = host_alloc(n * 2, False).view(torch.bfloat16).zero_()
    weights = host_alloc(n * 2, False).view(torch.bfloat16)
    parts = (state[:n], state[n : 2 * n], state[2 * n :])
    settings = AdamSettings(0.0, (0.9, 0.999), 1e-8, 0.0, True, False)  # changes nothing
    adam = CpuAdam(cpus)
    try:
        adam.step(parts, grads, weights, 1, settings)  # the pages warmed
        best = float("inf")
        for _ in range(2):
            ended = beside() if beside is not None else None
            began = time.perf_counter()
            adam.step(parts, grads, weights, 1, settings)
            seconds = time.perf_counter() - began
            best = min(best, seconds)
            if ended is not None:
                ended(seconds)
    finally:
        adam.close()
    return n / best


def shared_rates(host_alloc: HostAlloc, cpus: Sequence[int], device: Any,
                 cpu_alone: float, link_alone: float) -> tuple[float, float]:  # fmt: skip
    """The CPU step's rate and the link's (the slower direction) while both run at
    once, as they do in an update: copies both ways queued on two streams for longer
    than the step takes, and the link's rate read from the copies done while it ran
    (from the last one done when the step began). Both from the run whose step was the
    faster, neither above its rate alone."""
    torch = import_torch()
    ends = [torch.cuda.Stream(device) for _ in range(2)]
    host = [host_alloc(COPY_BYTES, True) for _ in range(2)]
    dev = [torch.empty(COPY_BYTES, dtype=torch.uint8, device=device) for _ in range(2)]
    # pieces short beside the step, enough of them to outlast one three times slower
    # than alone, the buffers used round and round
    copies = 2 + int(3 * UPDATE_PARAMS / cpu_alone / (SHARED_PIECE / link_alone))
    pieces = COPY_BYTES // SHARED_PIECE
    runs: list[tuple[float, float]] = []  # (CPU parameters/s, link bytes/s) a run

    def begin() -> Callable[[float], None]:
        marks = []
        for stream, dst, src in ((ends[0], host[0], dev[0]), (ends[1], dev[1], host[1])):
            events = [torch.cuda.Event(enable_timing=True) for _ in range(copies + 1)]
            with torch.cuda.stream(stream):
                events[0].record()
                for k, e in enumerate(events[1:]):
                    at = (k % pieces) * SHARED_PIECE
                    dst[at : at + SHARED_PIECE].copy_(src[at : at + SHARED_PIECE],
                                                      non_blocking=True)  # fmt: skip
                    e.record()
            marks.append(events)
        # where the step begins: the last piece done by now (queueing took a while)
        starts = [_done(events) for events in marks]

        def end(seconds: float) -> None:
            ends = [_done(events) for events in marks]  # the last piece done in the step
            torch.cuda.synchronize(device)  # the rest, before the next; elapsed_time needs it
            link = min(
                (b - a) * SHARED_PIECE / (events[a].elapsed_time(events[b]) / 1e3)
                if b > a else 0.0
                for events, a, b in zip(marks, starts, ends, strict=True)
            )  # fmt: skip
            runs.append((UPDATE_PARAMS / seconds, link))

        return end

    cpu_update_rate(host_alloc, cpus, beside=begin)
    cpu, link = max(runs)
    if link <= 0:  # no piece done in the step: a GPU too slow to tell
        link = link_alone
    return min(cpu, cpu_alone), min(link, link_alone)


def _done(events: list[Any]) -> int:
    """The index of the last event of ``events`` (recorded in order on one stream)
    done by now; 0 (the first, recorded before any piece) where none after it is."""
    last = 0
    for i, e in enumerate(events):
        if not e.query():
            break
        last = i
    return last


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
    measure_cpu = cpu_update is None
    shared = None
    if cpu_update is None:
        cpu_update = cpu_update_rate(host_alloc, cpus)
    if device is not None:
        torch = import_torch()
        if hbm_free is None:
            hbm_free = int(torch.cuda.mem_get_info(device)[0])
        measured = link is None and measure_cpu
        link = link_rate(host_alloc, device) if link is None else link
        flops = gpu_flops(device) if flops is None else flops
        if measured:  # both measured here: and beside each other
            shared = shared_rates(host_alloc, cpus, device, cpu_update, link)
        torch.cuda.empty_cache()  # what the measurements took goes back to the driver
    return Machine(tier, hbm_free, tier_free, link, cpu_update, flops, shared)
