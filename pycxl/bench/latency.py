"""Idle load-to-use latency by dependent-load pointer chase (the multichase method).

A random cycle through the buffer's cache lines, one line every STRIDE bytes (256, as
multichase: it keeps next-line and adjacent-line prefetchers from helping), visited in
random order inside groups of TLB_PAGES pages, groups in random order (TLB misses stay
rare and constant; multichase's default of 64 pages). The calling thread, pinned to one
initiator CPU, follows it: ns per load = elapsed / loads, best and median of the
samples, after one unmeasured pass over the whole cycle.
"""

from __future__ import annotations

import statistics
import time

from .._lib.compiled import kernels
from ..numa.placement import NumaBuffer
from ..numa.policy import Policy
from .context import (
    Placement,
    check_fits,
    huge_pages,
    last_level_cache,
    page_size,
    pinned,
    place,
)
from .results import BenchResult

STRIDE = 256  # bytes between chased lines
TLB_PAGES = 64  # pages per randomisation group
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
    began = time.perf_counter()
    p = placement or place(target, initiator)
    psize = page_size(page)
    size = max(MIN_SIZE, size or default_size())
    group = min(TLB_PAGES * psize, 1 << (size.bit_length() - 1))
    size = size // group * group
    check_fits(size, p)
    ffi, lib = kernels()
    n_lines = size // STRIDE
    loads = loads or max(n_lines, 1 << 22)
    loads -= loads % 16
    with (
        NumaBuffer(size, Policy.bind(p.node), huge=huge_pages(psize), populate=False) as buf,
        pinned(p.cpus[0]),
    ):
        start = ffi.cast("char *", buf.address)
        if lib.chase_build(start, n_lines, STRIDE, group, 0) != 0:
            raise ValueError(f"cannot build a chase over {size} bytes in groups of {group}")
        lib.chase_run(start, max(16, n_lines - n_lines % 16))  # warm TLB and caches
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
            "stride": STRIDE,
            "tlb_group": group,
            "pages_on_node": pages.get(p.node, 0),
            "pages": sum(pages.values()),
            "measure_s": time.perf_counter() - began,
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
