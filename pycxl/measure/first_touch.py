"""First-touch cost: time of each page's first write (allocate + zero + map) on a node."""

from __future__ import annotations

from ..base._lib import compiled
from ..base.errors import InvalidRequestError
from ..numa.placement import NumaBuffer
from ..numa.policy import Policy
from .conditions import default, huge_pages, page_size, pinned
from .results import FirstTouchResult
from .targets import Pair

DEFAULT_SIZE = 64 << 20


def first_touch(p: Pair, *, size: int | None = None, page: str = "4k") -> FirstTouchResult:
    """Write the first byte of each page of a fresh buffer on ``p.node``, timing each
    (default: 64 MiB)."""
    import numpy as np

    size = size or default(DEFAULT_SIZE, 1 << 20)
    psize = page_size(page)
    if size % psize:  # each page is timed: a part of one is not measured unsaid
        raise InvalidRequestError(
            f"size {size}: first touch times whole pages; give a multiple of {psize} bytes, "
            f"such as {max(psize, size // psize * psize)}"
        )
    p.check_fits(size)
    npages = size // psize
    ns = np.zeros(npages, dtype=np.uint32)
    with (
        NumaBuffer(size, Policy.bind(p.node), huge=huge_pages(psize), populate=False) as buf,
        pinned(p.cpus[0]),
    ):
        timer = compiled.timer_cost_ns()
        total = compiled.first_touch(buf.address, npages, psize, ns)
        pages = buf.pages_by_node()
    p.require_placed(pages, "first-touch buffer")
    per_page = np.maximum(ns.astype(np.int64) - timer, 0)
    p50, p90, p99 = (float(np.percentile(per_page, q)) for q in (50, 90, 99))
    return FirstTouchResult(
        **p.result_fields(pages, cpus=p.cpus[:1]),
        size=size,
        page_size=psize,
        p50_ns=p50,
        p90_ns=p90,
        p99_ns=p99,
        max_ns=float(per_page.max()),
        bytes_per_s=size / (total / 1e9),
        timer_ns=timer,
    )
