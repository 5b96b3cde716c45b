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
from ..system import snapshot
from .bandwidth import BYTES_PER_ELEMENT, INITIAL, KERNELS, SCALAR, expected_values
from .context import resolve_gpu
from .results import BenchResult

BLOCK = 256
BLOCKS_PER_SM = 32


def measure_gpu_bandwidth(
    gpu: str,
    *,
    kernel: str = "all",
    size: int = 1 << 30,
    ntimes: int = 20,
    block: int = BLOCK,
    blocks_per_sm: int = BLOCKS_PER_SM,
) -> list[BenchResult]:
    names = list(KERNELS) if kernel == "all" else [kernel]
    if any(k not in KERNELS for k in names):
        raise InvalidRequestError(f"kernel '{kernel}': use copy, scale, add, triad or all")
    if ntimes < 2:
        raise InvalidRequestError("ntimes must be at least 2 (the first pass is dropped)")
    g = resolve_gpu(gpu, snapshot())
    size = size // 16 * 16
    ctx = GpuContext(g.ordinal)
    arrays = [DeviceMemory(ctx, size) for _ in range(3)]
    mod = Module(ctx, "stream.ptx")
    ffi, lib = drv.driver()
    n = size // 8
    grid = min(-(-(n // 2) // block), g.sm_count * blocks_per_sm)
    ptrs = [ffi.new("unsigned long long *", a.ptr) for a in arrays]
    scalar = ffi.new("double *", SCALAR)
    pairs = ffi.new("unsigned long long *", n // 2)
    try:
        _fill(ffi, lib, arrays, n)
        times = _run(ffi, lib, mod, names, grid, block, [*ptrs, scalar, pairs], ntimes)
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
                    "gpu": g.name},
        ))  # fmt: skip
    return out


def _fill(ffi: Any, lib: Any, arrays: list[DeviceMemory], n: int) -> None:
    import numpy as np

    for a, v in zip(arrays, INITIAL, strict=True):
        host = np.full(n, v)
        drv.check("cuMemcpyHtoD", lib.cuMemcpyHtoD_v2(a.ptr, ffi.from_buffer(host), a.size))


def _run(ffi: Any, lib: Any, mod: Module, names: list[str], grid: int, block: int,
         args: list[Any], ntimes: int) -> list[float]:  # fmt: skip
    stream = ffi.new("CUstream *")
    drv.check("cuStreamCreate", lib.cuStreamCreate(stream, 1))
    s = stream[0]
    events = [ffi.new("CUevent *") for _ in range(2)]
    for e in events:
        drv.check("cuEventCreate", lib.cuEventCreate(e, 0))
    ms = ffi.new("float *")
    times = []
    try:
        for _ in range(ntimes):
            for k in names:
                drv.check("cuEventRecord", lib.cuEventRecord(events[0][0], s))
                mod.launch(f"stream_{k}", grid, block, s, args)
                drv.check("cuEventRecord", lib.cuEventRecord(events[1][0], s))
                drv.check("cuEventSynchronize", lib.cuEventSynchronize(events[1][0]))
                drv.check("cuEventElapsedTime",
                          lib.cuEventElapsedTime(ms, events[0][0], events[1][0]))  # fmt: skip
                times.append(float(ms[0]))
    finally:
        for e in events:
            lib.cuEventDestroy_v2(e[0])
        lib.cuStreamDestroy_v2(s)
    return times


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
