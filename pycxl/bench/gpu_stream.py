"""STREAM in a GPU's memory (BabelStream's method): grid-stride fp64 kernels on three
arrays, each pass timed by CUDA events, first pass dropped, best and median; STREAM byte
counts; arrays checked afterwards against the values the sequence must give."""

from __future__ import annotations

import statistics
from typing import Any

from ..errors import InvalidRequestError, OperationError
from ..gpu import driver as drv
from ..gpu.kernels import Module
from ..gpu.memory import DeviceMemory, GpuContext
from ..gpu.streams import Stream, Timer
from ..system import snapshot
from .bandwidth import BYTES_PER_ELEMENT, INITIAL, KERNELS, SCALAR, expected_values
from .context import resolve_gpu
from .results import BenchResult

# Launch shape, from benchmarks/gpu_stream_tune.py on an H200: one block per 256 pairs
# (the whole grid at once, as PyTorch launches) beat every grid-stride shape, by 3% or more.
BLOCK = 256
BLOCKS_PER_SM = 0  # 0: no cap, the grid covers the arrays in one step
UNROLL = 1  # pairs of doubles per thread per grid step (native/stream.ptx has 1, 2, 4)


def measure_gpu_bandwidth(
    gpu: str,
    *,
    kernel: str = "all",
    size: int = 1 << 30,
    ntimes: int = 20,
    block: int = BLOCK,
    blocks_per_sm: int = BLOCKS_PER_SM,
    unroll: int = UNROLL,
) -> list[BenchResult]:
    names = list(KERNELS) if kernel == "all" else [kernel]
    if any(k not in KERNELS for k in names):
        raise InvalidRequestError(f"kernel '{kernel}': use copy, scale, add, triad or all")
    if unroll not in (1, 2, 4):
        raise InvalidRequestError(f"unroll {unroll}: use 1, 2 or 4")
    if ntimes < 2:
        raise InvalidRequestError("ntimes must be at least 2 (the first pass is dropped)")
    g = resolve_gpu(gpu, snapshot())
    size = size // 16 * 16
    ctx = GpuContext(g.ordinal)
    arrays = [DeviceMemory(ctx, size) for _ in range(3)]
    mod = Module(ctx, "stream.ptx")
    ffi, lib = drv.driver()
    n = size // 8
    grid = -(-(n // 2) // (block * unroll))  # one grid step covers the arrays
    if blocks_per_sm > 0:  # else: that whole grid, as PyTorch launches
        grid = min(grid, g.sm_count * blocks_per_sm)
    ptrs = [ffi.new("unsigned long long *", a.ptr) for a in arrays]
    scalar = ffi.new("double *", SCALAR)
    pairs = ffi.new("unsigned long long *", n // 2)
    try:
        _fill(ffi, lib, arrays, n)
        launch = [f"stream_{k}_u{unroll}" for k in names]
        times = _run(ctx, mod, launch, grid, block, [*ptrs, scalar, pairs], ntimes)
        _validate(ffi, lib, arrays, expected_values(names, ntimes))
    finally:
        for a in arrays:
            a.close()
    out = []
    for q, k in enumerate(names):
        kept = [times[t * len(names) + q] for t in range(1, ntimes)]
        nbytes = BYTES_PER_ELEMENT[k] * n
        out.append(BenchResult(
            benchmark="bandwidth", target=g.target_name, node=None,
            initiator=g.target_name, cpus=(), size=size, page_size=0,
            figures={"bytes_per_s": nbytes / (min(kept) / 1e3),
                     "bytes_per_s_median": nbytes / (statistics.median(kept) / 1e3)},
            params={"kernel": k, "ntimes": ntimes, "grid": grid, "block": block,
                    "unroll": unroll, "gpu": g.name},
        ))  # fmt: skip
    return out


def _fill(ffi: Any, lib: Any, arrays: list[DeviceMemory], n: int) -> None:
    import numpy as np

    for a, v in zip(arrays, INITIAL, strict=True):
        host = np.full(n, v)
        drv.check("cuMemcpyHtoD", lib.cuMemcpyHtoD_v2(a.ptr, ffi.from_buffer(host), a.size))


def _run(ctx: GpuContext, mod: Module, kernels: list[str], grid: int, block: int,
         args: list[Any], ntimes: int) -> list[float]:  # fmt: skip
    stream = Stream(ctx)
    timer = Timer(stream)
    try:

        def one(name: str) -> float:
            return timer.time(lambda: mod.launch(name, grid, block, stream.handle, args))

        return [one(k) for _ in range(ntimes) for k in kernels]
    finally:
        timer.close()
        stream.close()


def _validate(ffi: Any, lib: Any, arrays: list[DeviceMemory], expect: list[float]) -> None:
    import numpy as np

    for name, a, want in zip("abc", arrays, expect, strict=True):
        host = np.empty(a.size // 8)
        drv.check("cuMemcpyDtoH", lib.cuMemcpyDtoH_v2(ffi.from_buffer(host), a.ptr, a.size))
        err = float(np.abs(host - want).max()) / abs(want or 1.0)
        if err > 1e-13:
            raise OperationError(
                f"GPU STREAM validation failed: array {name} differs from {want} by {err:.2e}"
            )
