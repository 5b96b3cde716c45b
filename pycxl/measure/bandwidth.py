"""Sustainable bandwidth by the STREAM rules.

Three arrays of doubles bound to the target node, first touched by the worker threads
(pinned to the initiator's CPUs) so pages sit where they are used; each kernel runs
``ntimes`` times, the first pass is dropped, best and median reported; Copy and Scale
count 16 bytes per element, Add and Triad 24; the arrays are then checked against the
values the same sequence of kernels must produce, like STREAM's checkSTREAMresults.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ..base._lib import compiled
from ..base.errors import InvalidRequestError, NotAvailableError, OperationError
from ..base.values import word
from ..numa.placement import NumaBuffer
from ..numa.policy import Policy
from .conditions import cache_fit, default, last_level_cache
from .results import BandwidthResult
from .targets import Pair

KERNELS = {"copy": 0, "scale": 1, "add": 2, "triad": 3}
INIT = 4
BYTES_PER_ELEMENT = {"copy": 16, "scale": 16, "add": 24, "triad": 24}
SCALAR = 3.0
SAMPLES = 10


def default_array_size() -> int:
    """Each array at least 4x the last-level cache (STREAM's rule), at least 64 MiB."""
    return default(max(4 * last_level_cache(), 64 << 20), 1 << 20)


def kernel_names(kernel: str) -> list[str]:
    """'all' or one kernel name -> the kernels to run, in STREAM's order."""
    if kernel == "all":
        return list(KERNELS)
    return [word(kernel, "kernel", [*KERNELS, "all"])]


def stream_bandwidth(
    p: Pair,
    *,
    threads: int | None = None,
    kernel: str = "all",
    size: int | None = None,
    samples: int | None = None,
    nt_stores: bool = False,
) -> list[BandwidthResult]:
    """STREAM on three arrays on ``p.node`` by threads on ``p.cpus``; one result per
    kernel. ``samples`` timed passes follow one untimed pass."""
    names = kernel_names(kernel)
    nthreads = threads or len(p.cpus)
    if not 1 <= nthreads <= len(p.cpus):
        raise InvalidRequestError(
            f"{nthreads} threads but initiator {p.initiator.name} has {len(p.cpus)} CPUs"
        )
    samples = samples or default(SAMPLES, 2)
    if samples < 1:
        raise InvalidRequestError(f"samples must be at least 1, not {samples}")
    ntimes = samples + 1
    if nt_stores and not compiled.stream_has_nt():
        raise NotAvailableError("non-temporal stores need a CPU with AVX")
    array = max(4096, (size or default_array_size()) // 4096 * 4096)
    p.check_fits(3 * array)
    n = array // 8
    cpus = p.cpus[:nthreads]
    seq = [KERNELS[k] for k in names]
    policy = Policy.bind(p.node)
    with (
        NumaBuffer(array, policy, populate=False) as a,
        NumaBuffer(array, policy, populate=False) as b,
        NumaBuffer(array, policy, populate=False) as c,
    ):
        arrays = (a.address, b.address, c.address)
        compiled.stream_run([INIT], arrays, n, SCALAR, cpus, 1, False)  # touched by the threads
        times = compiled.stream_run(seq, arrays, n, SCALAR, cpus, ntimes, nt_stores)
        _validate((a, b, c), expected_values(names, ntimes))
        placed = [x.pages_by_node() for x in (a, b, c)]
    for name, pl in zip("abc", placed, strict=True):
        p.require_placed(pl, f"STREAM array {name}")
    pages: dict[int, int] = {}
    for pl in placed:
        for node, count in pl.items():
            pages[node] = pages.get(node, 0) + count
    per_kernel = {
        k: [int(times[t * len(seq) + q]) for t in range(ntimes)] for q, k in enumerate(names)
    }
    results = []
    for k in names:
        kept = per_kernel[k][1:]  # the first pass warms caches and TLBs
        nbytes = BYTES_PER_ELEMENT[k] * n
        results.append(
            BandwidthResult(
                **p.result_fields(pages, cpus=cpus),
                size=array,
                page_size=4096,
                kernel=k,
                bytes_per_s=nbytes / (min(kept) / 1e9),
                bytes_per_s_median=nbytes / (statistics.median(kept) / 1e9),
                samples=samples,
                threads=nthreads,
                nt_stores=nt_stores,
                **cache_fit(nbytes),  # the arrays the kernel reads and writes
            )
        )
    return results


INITIAL = (1.0, 2.0, 0.0)  # a, b, c as STREAM initialises them (K_INIT in bench.c)


def expected_values(kernels: Sequence[str], ntimes: int) -> list[float]:
    """a, b, c after ``ntimes`` passes of ``kernels`` in order, as STREAM checks them."""
    a, b, c = INITIAL
    for _ in range(ntimes):
        for kernel in kernels:
            if kernel == "copy":
                c = a
            elif kernel == "scale":
                b = SCALAR * c
            elif kernel == "add":
                c = a + b
            else:
                a = b + SCALAR * c
    return [a, b, c]


def _validate(bufs: tuple[NumaBuffer, NumaBuffer, NumaBuffer], expect: list[float]) -> None:
    import numpy as np

    for name, buf, want in zip("abc", bufs, expect, strict=True):
        arr = buf.array("float64")
        err = float(np.abs(arr - want).max()) / abs(want or 1.0)
        del arr
        if err > 1e-13:
            raise OperationError(
                f"STREAM validation failed: array {name} differs from {want} by {err:.2e}"
            )
