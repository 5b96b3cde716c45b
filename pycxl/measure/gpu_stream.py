"""STREAM in a GPU's memory (BabelStream's method): fp64 kernels on three arrays, each
pass timed by CUDA events, the first pass untimed, best and median; STREAM byte counts;
arrays checked afterwards against the values the sequence must give."""

from __future__ import annotations

import statistics

from ..errors import InvalidRequestError, OperationError
from ..gpu.devices import GpuDevice, with_cuda_facts
from ..gpu.memory import DeviceMemory, GpuContext
from ..gpu.ptx import Arg, Module, f64, pointer, u64
from ..gpu.streams import Stream, Timer
from .bandwidth import BYTES_PER_ELEMENT, INITIAL, SCALAR, expected_values, kernel_names
from .conditions import cache_fit, default
from .results import BandwidthResult

# Launch shape, from benchmarks/gpu_stream_tune.py on an H200: one block per 256 pairs
# (the whole grid at once, as PyTorch launches) beat every grid-stride shape, by 3% or more.
BLOCK = 256
BLOCKS_PER_SM = 0  # 0: no cap, the grid covers the arrays in one step
UNROLL = 1  # pairs of doubles per thread per grid step (native/stream.ptx has 1, 2, 4)
DEFAULT_SIZE = 1 << 30
SAMPLES = 20


def gpu_stream_bandwidth(
    g: GpuDevice,
    *,
    kernel: str = "all",
    size: int | None = None,
    samples: int | None = None,
    block: int = BLOCK,
    blocks_per_sm: int = BLOCKS_PER_SM,
    unroll: int = UNROLL,
) -> list[BandwidthResult]:
    """STREAM kernels on three ``size``-byte arrays in ``g``'s memory; one result each."""
    names = kernel_names(kernel)
    size = size or default(DEFAULT_SIZE, 1 << 20)
    samples = samples or default(SAMPLES, 2)
    if unroll not in (1, 2, 4):
        raise InvalidRequestError(f"unroll {unroll}: use 1, 2 or 4")
    if samples < 1:
        raise InvalidRequestError(f"samples must be at least 1, not {samples}")
    ntimes = samples + 1
    size = max(16, size // 16 * 16)
    ctx = GpuContext.of(g)
    arrays = [DeviceMemory(ctx, size) for _ in range(3)]
    mod = Module(ctx, "stream.ptx")
    n = size // 8
    grid = -(-(n // 2) // (block * unroll))  # one grid step covers the arrays
    if blocks_per_sm > 0:  # else: that whole grid, as PyTorch launches
        grid = min(grid, (with_cuda_facts(g).sm_count or 1) * blocks_per_sm)
    args = [*(pointer(a) for a in arrays), f64(SCALAR), u64(n // 2)]
    try:
        _fill(arrays, n)
        launch = [f"stream_{k}_u{unroll}" for k in names]
        times = _run(ctx, mod, launch, grid, block, args, ntimes)
        _validate(arrays, expected_values(names, ntimes))
    finally:
        for a in arrays:
            a.close()
    out = []
    for q, k in enumerate(names):
        kept = [times[t * len(names) + q] for t in range(1, ntimes)]
        nbytes = BYTES_PER_ELEMENT[k] * n
        out.append(BandwidthResult(
            target=g.target_name, node=None, initiator=g.target_name, cpus=(), size=size,
            page_size=0, kernel=k,
            bytes_per_s=nbytes / (min(kept) / 1e3),
            bytes_per_s_median=nbytes / (statistics.median(kept) / 1e3),
            samples=samples, gpu=g.name, grid=grid, block=block, unroll=unroll,
            **cache_fit(nbytes, g.l2_cache),
        ))  # fmt: skip
    return out


def _fill(arrays: list[DeviceMemory], n: int) -> None:
    import numpy as np

    for a, v in zip(arrays, INITIAL, strict=True):
        a.copy_from_host(np.full(n, v))


def _run(ctx: GpuContext, mod: Module, functions: list[str], grid: int, block: int,
         args: list[Arg], ntimes: int) -> list[float]:  # fmt: skip
    stream = Stream(ctx)
    timer = Timer(stream)
    try:

        def one(name: str) -> float:
            return timer.time(lambda: mod.launch(name, grid, block, stream, args))

        return [one(f) for _ in range(ntimes) for f in functions]
    finally:
        timer.close()
        stream.close()


def _validate(arrays: list[DeviceMemory], expect: list[float]) -> None:
    import numpy as np

    for name, a, want in zip("abc", arrays, expect, strict=True):
        host = np.empty(a.size // 8)
        a.copy_to_host(host)
        err = float(np.abs(host - want).max()) / abs(want or 1.0)
        if err > 1e-13:
            raise OperationError(
                f"GPU STREAM validation failed: array {name} differs from {want} by {err:.2e}"
            )
