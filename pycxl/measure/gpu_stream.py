"""STREAM in a GPU's memory (BabelStream's method): fp64 kernels on three arrays, each
pass timed by CUDA events, the first pass untimed, best and median; STREAM byte counts;
arrays checked afterwards against the values the sequence must give.

``tier_stream_bandwidth`` runs the same kernels with the three arrays on a host tier
(memory the driver creates on that node and maps into the GPU's address space: see
tier_pool): the GPU reads and writes the tier in place over its link (zero-copy), and
the arrays' pages are counted on the node afterwards."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from ..base.errors import InvalidRequestError, OperationError
from ..gpu.context import GpuContext
from ..gpu.devices import with_cuda_facts
from ..gpu.inventory import GpuDevice
from ..gpu.memory import DeviceMemory
from ..gpu.ptx import Arg, Module, f64, pointer, u64
from ..gpu.streams import Stream, Timer
from .bandwidth import BYTES_PER_ELEMENT, INITIAL, SCALAR, expected_values, kernel_names
from .conditions import cache_fit, default
from .results import BandwidthResult

if TYPE_CHECKING:
    from ..gpu.tier_pool import TierPool

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
    try:
        times, grid = _stream(ctx, g, arrays, names, size, ntimes, block, blocks_per_sm, unroll)
    finally:
        for a in arrays:
            a.close()
    return _results(g, names, times, size, samples, grid, block, unroll,
                    dict(target=g.target_name, node=None, page_size=0))  # fmt: skip


def tier_stream_bandwidth(
    g: GpuDevice,
    pool: TierPool,
    *,
    kernel: str = "all",
    size: int | None = None,
    samples: int | None = None,
) -> list[BandwidthResult]:
    """STREAM kernels run by ``g`` on three ``size``-byte arrays on ``pool``'s tier, read
    and written in place; one result each, with the arrays' pages on the node."""
    names = kernel_names(kernel)
    size = max(16, (size or default(DEFAULT_SIZE, 1 << 20)) // 16 * 16)
    samples = samples or default(SAMPLES, 2)
    if samples < 1:
        raise InvalidRequestError(f"samples must be at least 1, not {samples}")
    ctx = GpuContext.of(g)
    ctx.activate()
    arrays = [pool.allocate(size) for _ in range(3)]
    try:
        times, grid = _stream(ctx, g, arrays, names, size, samples + 1, BLOCK, BLOCKS_PER_SM,
                              UNROLL)  # fmt: skip
        counts: dict[int, int] = {}
        for a in arrays:
            for k, v in a.pages_by_node().items():
                counts[k] = counts.get(k, 0) + v
    finally:
        for a in arrays:
            a.close()
    where = dict(target=pool.tier, node=pool.node, page_size=4096,
                 pages_on_node=counts.get(pool.node, 0), pages=sum(counts.values()))  # fmt: skip
    return _results(g, names, times, size, samples, grid, BLOCK, UNROLL, where)


def _stream(ctx: GpuContext, g: GpuDevice, arrays: list[Any], names: list[str], size: int,
            ntimes: int, block: int, blocks_per_sm: int,
            unroll: int) -> tuple[list[float], int]:  # fmt: skip
    """Each kernel's pass times (ms, in order, ``ntimes`` rounds) on ``arrays``, filled
    first and checked after; and the grid."""
    mod = Module(ctx, "stream.ptx")
    n = size // 8
    grid = -(-(n // 2) // (block * unroll))  # one grid step covers the arrays
    if blocks_per_sm > 0:  # else: that whole grid, as PyTorch launches
        grid = min(grid, (with_cuda_facts(g).sm_count or 1) * blocks_per_sm)
    args = [*(pointer(a) for a in arrays), f64(SCALAR), u64(n // 2)]
    _fill(arrays, n)
    launch = [f"stream_{k}_u{unroll}" for k in names]
    times = _run(ctx, mod, launch, grid, block, args, ntimes)
    _validate(arrays, expected_values(names, ntimes))
    return times, grid


def _results(g: GpuDevice, names: list[str], times: list[float], size: int, samples: int,
             grid: int, block: int, unroll: int,
             where: dict[str, Any]) -> list[BandwidthResult]:  # fmt: skip
    n = size // 8
    out = []
    for q, k in enumerate(names):
        kept = [times[t * len(names) + q] for t in range(1, samples + 1)]
        nbytes = BYTES_PER_ELEMENT[k] * n
        out.append(BandwidthResult(
            initiator=g.target_name, cpus=(), size=size, kernel=k,
            bytes_per_s=nbytes / (min(kept) / 1e3),
            bytes_per_s_median=nbytes / (statistics.median(kept) / 1e3),
            samples=samples, gpu=g.name, grid=grid, block=block, unroll=unroll,
            **cache_fit(nbytes, g.l2_cache), **where,
        ))  # fmt: skip
    return out


def _host_view(a: Any, n: int) -> Any:
    """Tier memory as the CPU sees it (the same pages), as n doubles."""
    import ctypes

    import numpy as np

    return np.ctypeslib.as_array((ctypes.c_double * n).from_address(a.ptr))


def _fill(arrays: list[Any], n: int) -> None:
    import numpy as np

    for a, v in zip(arrays, INITIAL, strict=True):
        if isinstance(a, DeviceMemory):
            a.copy_from_host(np.full(n, v))
        else:
            _host_view(a, n)[:] = v


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


def _validate(arrays: list[Any], expect: list[float]) -> None:
    import numpy as np

    for name, a, want in zip("abc", arrays, expect, strict=True):
        if isinstance(a, DeviceMemory):
            host = np.empty(a.size // 8)
            a.copy_to_host(host)
        else:  # the kernels' stream is synchronised: the CPU reads the pages themselves
            host = _host_view(a, a.size // 8).copy()
        err = float(np.abs(host - want).max()) / abs(want or 1.0)
        if err > 1e-13:
            raise OperationError(
                f"GPU STREAM validation failed: array {name} differs from {want} by {err:.2e}"
            )
