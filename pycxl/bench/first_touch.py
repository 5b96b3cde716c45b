"""First-touch cost: time of each page's first write (allocate + zero + map) on a node."""

from __future__ import annotations

from .._lib.compiled import kernels
from ..numa.placement import NumaBuffer
from ..numa.policy import Policy
from .context import (
    Placement,
    check_fits,
    default,
    huge_pages,
    page_size,
    pinned,
    require_placed,
)
from .results import FirstTouchResult

DEFAULT_SIZE = 64 << 20


def first_touch(p: Placement, *, size: int | None = None, page: str = "4k") -> FirstTouchResult:
    """Write the first byte of each page of a fresh buffer on ``p.node``, timing each
    (default: 64 MiB)."""
    import numpy as np

    size = size or default(DEFAULT_SIZE, 1 << 20)
    psize = page_size(page)
    size = max(psize, size // psize * psize)
    check_fits(size, p)
    ffi, lib = kernels()
    npages = size // psize
    ns = np.zeros(npages, dtype=np.uint32)
    with (
        NumaBuffer(size, Policy.bind(p.node), huge=huge_pages(psize), populate=False) as buf,
        pinned(p.cpus[0]),
    ):
        timer = int(lib.timer_cost_ns())
        total = int(
            lib.first_touch(
                ffi.cast("char *", buf.address),
                npages,
                psize,
                ffi.cast("uint32_t *", ns.ctypes.data),
            )
        )
        pages = buf.pages_by_node()
    require_placed(pages, p, "first-touch buffer")
    per_page = np.maximum(ns.astype(np.int64) - timer, 0)
    p50, p90, p99 = (float(np.percentile(per_page, q)) for q in (50, 90, 99))
    return FirstTouchResult(
        target=p.target,
        node=p.node,
        initiator=p.initiator,
        cpus=(p.cpus[0],),
        size=size,
        page_size=psize,
        pages_on_node=pages.get(p.node, 0),
        pages=sum(pages.values()),
        p50_ns=p50,
        p90_ns=p90,
        p99_ns=p99,
        max_ns=float(per_page.max()),
        bytes_per_s=size / (total / 1e9),
        timer_ns=timer,
    )
