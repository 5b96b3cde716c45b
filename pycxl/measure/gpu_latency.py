"""GPU load-to-use latency: one GPU thread follows a pointer chase (native/chase.ptx,
run by ``pycxl.gpu.chase``) through the GPU's own memory, or through host memory on a
tier, mapped for the GPU (zero-copy: each load crosses the link to the host).

The cycle is the CPU chase's (256-byte stride, random order inside 64-page groups), so
GPU and CPU figures come from the same access pattern. Each sample is one launch timed
by CUDA events, ns per load = time / loads; each launch goes on where the last one
stopped, so the samples walk the whole cycle; one unmeasured walk over the cycle first;
best and median.
"""

from __future__ import annotations

import statistics
import time

from ..base.errors import InvalidRequestError
from ..gpu.devices import with_cuda_facts
from ..gpu.inventory import GpuDevice
from .conditions import cache_fit, default, huge_pages, page_size
from .latency import STRIDE, TLB_PAGES, sweep_sizes
from .results import LatencyResult
from .targets import Pair

LOADS = 1 << 18  # per sample: 0.05-0.3 s at GPU memory latencies
WARM_LOADS = 1 << 22  # the first walk covers the cycle (up to 1 GiB arenas)
SAMPLES = 5


def _l2_cache(g: GpuDevice) -> int:
    return with_cuda_facts(g).l2_cache or 0  # only CUDA knows it


def default_size(g: GpuDevice) -> int:
    """Four times the GPU's L2 cache, at least 256 MiB."""
    return default(max(4 * _l2_cache(g), 256 << 20), 1 << 20)


def gpu_sweep_sizes(g: GpuDevice, top: int | None = None) -> list[int]:
    """Working sets from 16 KiB to twice the GPU's L2 cache."""
    return sweep_sizes(top or 2 * max(_l2_cache(g), 1 << 20))


def gpu_chase_latency(
    p: Pair,
    *,
    size: int | None = None,
    page: str = "4k",
    samples: int | None = None,
    loads: int | None = None,
) -> LatencyResult:
    """Latency of loads from ``p.gpu`` to its own memory (``p.in_gpu_memory``) or to
    host memory on ``p.node``, registered and mapped for the GPU (zero-copy)."""
    from ..gpu import chase
    from ..gpu.context import GpuContext

    g = p.gpu
    if g is None:
        raise InvalidRequestError(f"{p.initiator.name} is not a GPU: its CPUs chase with "
                                  "pycxl.measure.latency")  # fmt: skip
    began = time.perf_counter()
    samples = samples or default(SAMPLES, 2)
    loads = loads or default(LOADS, 1 << 14)
    if samples < 1:
        raise InvalidRequestError(f"samples must be at least 1, not {samples}")
    on_host = not p.in_gpu_memory
    psize = page_size(page) if on_host else 4096
    size = size or default_size(g)
    group = min(TLB_PAGES * psize, 1 << (size.bit_length() - 1))
    size = size // group * group
    loads = max(16, loads - loads % 16)
    ctx = GpuContext.of(g)
    if on_host:
        p.check_fits(size)
        run = chase.in_host_memory(ctx, size, STRIDE, group, p.node, huge_pages(psize))
    else:
        run = chase.in_gpu_memory(ctx, size, STRIDE, group)
    warm = max(16, min(size // STRIDE, WARM_LOADS) // 16 * 16)
    with run as chain:
        ns = chain.sample(loads, samples, warm)
        placed = chain.pages_by_node()
    return LatencyResult(
        **p.result_fields(placed if on_host else None), size=size,
        page_size=psize if on_host else 0, latency_ns=min(ns),
        latency_ns_median=statistics.median(ns), loads=loads, samples=samples, stride=STRIDE,
        tlb_group=group, gpu=g.name, measure_s=time.perf_counter() - began,
        **cache_fit(size, g.l2_cache),
    )  # fmt: skip


class GpuChaser:
    """A GPU's zero-copy chase of host memory on ``node``, timed per launch of
    ``window_loads`` loads: the chaser of a loaded-latency curve from a GPU."""

    window_loads = 4096

    def __init__(self, g: GpuDevice, node: int, size: int | None = None, page: str = "4k") -> None:
        from ..gpu import chase
        from ..gpu.context import GpuContext

        self.gpu = g
        self.page_size = page_size(page)
        size = size or default_size(g)
        group = min(TLB_PAGES * self.page_size, 1 << (size.bit_length() - 1))
        self.size = size // group * group
        self._chain = chase.in_host_memory(GpuContext.of(g), self.size, STRIDE, group, node,
                                           huge_pages(self.page_size))  # fmt: skip
        self._launch = chase.Launcher(self._chain)
        self._launch(max(16, min(self.size // STRIDE, WARM_LOADS) // 16 * 16))

    def windows(self, seconds: float) -> list[float]:
        """ns per load of each launch, launch after launch, for ``seconds``."""
        out: list[float] = []
        end = time.perf_counter() + seconds
        while not out or time.perf_counter() < end:
            out.append(self._launch(self.window_loads))
        return out

    def pages_by_node(self) -> dict[int, int]:
        """Pages of the chased host memory per node."""
        return self._chain.pages_by_node()

    def close(self) -> None:
        """Release the launch's state, the mapping and the memory."""
        self._launch.close()
        self._chain.close()
