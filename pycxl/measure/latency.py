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

from ..base._lib import compiled
from ..base.values import CHASE_MIN_SIZE
from ..numa.placement import NumaBuffer
from ..numa.policy import Policy
from .conditions import cache_fit, default, huge_pages, last_level_cache, page_size, pinned
from .results import LatencyResult
from .targets import Pair

STRIDE = 256  # bytes between chased lines
TLB_PAGES = 64  # pages per randomisation group
MIN_SIZE = CHASE_MIN_SIZE  # declared with the size checker, which the doors call
SAMPLES = 7


QUICK_SIZE = 1 << 20
QUICK_LOADS = 1 << 16


def default_size() -> int:
    """Four times the last-level cache, at least 256 MiB: beyond every cache."""
    return default(max(4 * last_level_cache(), 256 << 20), QUICK_SIZE)


def chase_latency(
    p: Pair,
    *,
    size: int | None = None,
    page: str = "4k",
    samples: int | None = None,
    loads: int | None = None,
) -> LatencyResult:
    """Latency of dependent loads from ``p.cpus[0]`` to memory on ``p.node``.

    Takes checked values (``size`` at least ``values.CHASE_MIN_SIZE``, ``samples`` a
    count): the public functions (``pycxl.bench``) and the command line check them."""
    began = time.perf_counter()
    samples = samples or default(SAMPLES, 2)
    psize = page_size(page)
    size = size or default_size()
    group = min(TLB_PAGES * psize, 1 << (size.bit_length() - 1))
    size = size // group * group
    p.check_fits(size)
    n_lines = size // STRIDE
    loads = loads or default(max(n_lines, 1 << 22), QUICK_LOADS)
    loads = max(16, loads - loads % 16)
    with (
        NumaBuffer(size, Policy.bind(p.node), huge=huge_pages(psize), populate=False) as buf,
        pinned(p.cpus[0]),
    ):
        compiled.chase_build(buf.address, size, STRIDE, group)
        compiled.chase_run(buf.address, max(16, n_lines - n_lines % 16))  # warm TLB and caches
        ns = [compiled.chase_run(buf.address, loads) / loads for _ in range(samples)]
        pages = buf.pages_by_node()
    p.require_placed(pages, "chase arena")
    return LatencyResult(
        **p.result_fields(pages, cpus=p.cpus[:1]),
        size=size,
        page_size=psize,
        latency_ns=min(ns),
        latency_ns_median=statistics.median(ns),
        loads=loads,
        samples=samples,
        stride=STRIDE,
        tlb_group=group,
        measure_s=time.perf_counter() - began,
        **cache_fit(size),
    )


def sweep_sizes(top: int | None = None) -> list[int]:
    """Working-set sizes from 16 KiB to ``top`` (default: twice the last-level cache)."""
    top = top or 2 * last_level_cache()
    sizes, s = [], MIN_SIZE
    while s <= top:
        sizes.append(s)
        s *= 2
    return sizes
