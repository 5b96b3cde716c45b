"""Idle load-to-use latency by dependent-load pointer chase (the multichase method).

A random cycle through every cache line of a buffer on the target, grouped by page so
each page costs one TLB miss per page's worth of lines; the calling thread, pinned to
one initiator CPU, follows it. ns per load = elapsed / loads, best and median of the
samples, after one unmeasured pass.
"""

from __future__ import annotations

import statistics

from ..numa.placement import NumaBuffer
from ..numa.policy import Policy
from .context import Placement, check_fits, last_level_cache, page_size, pinned, place
from .native import kernels
from .results import BenchResult

LINE = 64  # bytes per chase step: one cache line
MIN_SIZE = 16 << 10


def default_size() -> int:
    """Four times the last-level cache, at least 256 MiB: beyond every cache."""
    return max(4 * last_level_cache(), 256 << 20)


def measure_latency(
    target: str,
    *,
    initiator: str | None = None,
    size: int | None = None,
    page: str = "4k",
    samples: int = 7,
    loads: int | None = None,
    placement: Placement | None = None,
) -> BenchResult:
    p = placement or place(target, initiator)
    psize = page_size(page)
    size = size or default_size()
    size = max(MIN_SIZE, size // psize * psize) if size >= psize else size // LINE * LINE
    check_fits(size, p)
    ffi, lib = kernels()
    group = min(psize, size)
    n_lines = size // LINE
    loads = loads or max(n_lines, 1 << 22)
    loads -= loads % 16
    with (
        NumaBuffer(
            size, Policy.bind(p.node), huge="thp" if psize > 4096 else "none", populate=False
        ) as buf,
        pinned(p.cpus[0]),
    ):
        start = ffi.cast("char *", buf.address)
        if lib.chase_build(start, n_lines, LINE, group, 0) != 0:
            raise ValueError(f"cannot build a chase over {size} bytes")
        lib.chase_run(start, n_lines - n_lines % 16 or 16)  # warm: TLB, caches
        ns = [lib.chase_run(start, loads) / loads for _ in range(samples)]
        pages = buf.pages_by_node()
    return BenchResult(
        benchmark="latency",
        target=p.target,
        node=p.node,
        initiator=p.initiator,
        cpus=(p.cpus[0],),
        size=size,
        page_size=psize,
        figures={"latency_ns": min(ns), "latency_ns_median": statistics.median(ns)},
        params={
            "loads": loads,
            "samples": samples,
            "pages_on_node": pages.get(p.node, 0),
            "pages": sum(pages.values()),
        },
    )


def sweep_sizes(top: int | None = None) -> list[int]:
    """Working-set sizes from 16 KiB to beyond the last-level cache, doubling."""
    top = top or 2 * last_level_cache()
    sizes, s = [], MIN_SIZE
    while s <= top:
        sizes.append(s)
        s *= 2
    return sizes
