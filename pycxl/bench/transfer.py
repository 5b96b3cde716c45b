"""Copy bandwidth between a GPU and host memory on a tier (nvbandwidth's method).

The host buffer is placed on the target node and, unless ``pageable``, pinned and
registered with the driver; each copy is timed by CUDA events on one stream around the
copy alone; ``iterations`` copies after two unmeasured ones; best and median.
"""

from __future__ import annotations

import statistics
from typing import Any

from ..errors import InvalidRequestError
from ..gpu import driver as drv
from ..gpu.memory import DeviceMemory, GpuContext, HostMemory
from ..numa.placement import allocate
from ..system import snapshot
from .context import check_fits, place, resolve_gpu
from .results import BenchResult

DIRECTIONS = ("h2d", "d2h")


def measure_transfer(
    gpu: str,
    target: str,
    *,
    direction: str = "both",
    size: int = 1 << 30,
    pageable: bool = False,
    iterations: int = 20,
) -> list[BenchResult]:
    dirs = list(DIRECTIONS) if direction == "both" else [direction]
    if any(d not in DIRECTIONS for d in dirs):
        raise InvalidRequestError(f"direction '{direction}': use h2d, d2h or both")
    if iterations < 1:
        raise InvalidRequestError("iterations must be at least 1")
    system = snapshot()
    g = resolve_gpu(gpu, system)
    p = place(target, None, system)
    check_fits(size, p)
    ctx = GpuContext(g.ordinal)
    dev = DeviceMemory(ctx, size)
    host = allocate(size, target)
    reg = None if pageable else HostMemory(ctx, host)
    ffi, lib = drv.driver()
    try:
        results = []
        for d in dirs:
            times = _time_copies(ffi, lib, d, dev.ptr, host.address, size, iterations)
            results.append(
                BenchResult(
                    benchmark="transfer",
                    target=p.target,
                    node=p.node,
                    initiator=g.target_name,
                    cpus=(),
                    size=size,
                    page_size=4096,
                    figures={
                        "bytes_per_s": size / (min(times) / 1e3),
                        "bytes_per_s_median": size / (statistics.median(times) / 1e3),
                    },
                    params={
                        "direction": d,
                        "pinned": not pageable,
                        "iterations": iterations,
                        "gpu": g.name,
                        "pages_on_node": host.pages_by_node().get(p.node, 0),
                    },
                )
            )
        return results
    finally:
        if reg is not None:
            reg.close()
        dev.close()
        host.close()


def _time_copies(
    ffi: Any, lib: Any, d: str, dptr: int, hptr: int, size: int, n: int
) -> list[float]:
    stream = ffi.new("CUstream *")
    drv.check("cuStreamCreate", lib.cuStreamCreate(stream, 1))  # non-blocking
    start, end = ffi.new("CUevent *"), ffi.new("CUevent *")
    drv.check("cuEventCreate", lib.cuEventCreate(start, 0))
    drv.check("cuEventCreate", lib.cuEventCreate(end, 0))
    host = ffi.cast("void *", hptr)
    s = stream[0]

    def copy() -> None:
        if d == "h2d":
            drv.check("cuMemcpyHtoDAsync", lib.cuMemcpyHtoDAsync_v2(dptr, host, size, s))
        else:
            drv.check("cuMemcpyDtoHAsync", lib.cuMemcpyDtoHAsync_v2(host, dptr, size, s))

    ms = ffi.new("float *")
    times = []
    try:
        for _ in range(2):
            copy()
        drv.check("cuStreamSynchronize", lib.cuStreamSynchronize(s))
        for _ in range(n):
            drv.check("cuEventRecord", lib.cuEventRecord(start[0], s))
            copy()
            drv.check("cuEventRecord", lib.cuEventRecord(end[0], s))
            drv.check("cuEventSynchronize", lib.cuEventSynchronize(end[0]))
            drv.check("cuEventElapsedTime", lib.cuEventElapsedTime(ms, start[0], end[0]))
            times.append(float(ms[0]))
    finally:
        lib.cuEventDestroy_v2(start[0])
        lib.cuEventDestroy_v2(end[0])
        lib.cuStreamDestroy_v2(s)
    return times
