"""GPU load-to-use latency: one GPU thread follows a pointer chase (native/chase.ptx)
through the GPU's own memory, or through host memory on a tier, mapped for the GPU
(zero-copy: each load crosses the link to the host).

The cycle is the CPU chase's (native/bench.c chase_build: 256-byte stride, random order
inside 64-page groups), built on the host and moved to device addresses, so GPU and CPU
figures come from the same access pattern. Each sample is one kernel launch timed by CUDA
events, ns per load = time / loads; each launch goes on where the last one stopped, so
the samples walk the whole cycle; one unmeasured walk over the cycle first; best and
median.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from .._lib.compiled import kernels
from ..errors import InvalidRequestError
from ..gpu.devices import GpuDevice, with_cuda_facts
from ..gpu.kernels import Module, u64
from ..gpu.memory import DeviceMemory, GpuContext, HostMemory
from ..gpu.streams import Stream, Timer
from ..numa.placement import NumaBuffer
from ..numa.policy import Policy
from .context import Placement, cache_fit, check_fits, default, huge_pages, page_size
from .latency import STRIDE, TLB_PAGES, check_size, sweep_sizes
from .results import LatencyResult

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
    g: GpuDevice,
    host: Placement | None = None,
    *,
    size: int | None = None,
    page: str = "4k",
    samples: int | None = None,
    loads: int | None = None,
) -> LatencyResult:
    """Latency of loads from ``g`` to its own memory (``host`` None) or to host memory
    placed by ``host``, registered and mapped for the GPU (zero-copy)."""
    began = time.perf_counter()
    samples = samples or default(SAMPLES, 2)
    loads = loads or default(LOADS, 1 << 14)
    if samples < 1:
        raise InvalidRequestError(f"samples must be at least 1, not {samples}")
    psize = 4096 if host is None else page_size(page)
    check_size(size)
    size = size or default_size(g)
    group = min(TLB_PAGES * psize, 1 << (size.bit_length() - 1))
    size = size // group * group
    loads = max(16, loads - loads % 16)
    ctx = GpuContext.of(g)
    if host is None:
        run = _in_gpu_memory(ctx, size, group)
    else:
        check_fits(size, host)
        run = _in_host_memory(ctx, size, group, host.node, psize)
    warm = max(16, min(size // STRIDE, WARM_LOADS) // 16 * 16)
    with run as chain:
        ns = chain.sample(loads, samples, warm)
        placed = chain.pages_by_node()
    on_host = host is not None
    return LatencyResult(
        target=host.target if host else g.target_name, node=host.node if host else None,
        initiator=g.target_name, cpus=(), size=size, page_size=psize if on_host else 0,
        pages_on_node=placed.get(host.node, 0) if host else None,
        pages=sum(placed.values()) if on_host else None,
        latency_ns=min(ns), latency_ns_median=statistics.median(ns), loads=loads,
        samples=samples, stride=STRIDE, tlb_group=group, gpu=g.name,
        measure_s=time.perf_counter() - began, **cache_fit(size, g.l2_cache),
    )  # fmt: skip


class _Chain:
    """A cycle the GPU can follow from ``start``, with what keeps its memory alive."""

    def __init__(self, ctx: GpuContext, start: int, keep: list[Any],
                 host: NumaBuffer | None = None) -> None:  # fmt: skip
        self.ctx, self.start, self.keep, self.host = ctx, start, keep, host

    def sample(self, loads: int, samples: int, warm: int) -> list[float]:
        with _Launcher(self) as launch:
            launch(warm)  # JIT, TLB and caches warm: the whole cycle once
            return [launch(loads) for _ in range(samples)]

    def pages_by_node(self) -> dict[int, int]:
        return self.host.pages_by_node() if self.host is not None else {}

    def __enter__(self) -> _Chain:
        return self

    def __exit__(self, *exc: object) -> None:
        for k in reversed(self.keep):
            k.close()


class _Launcher:
    """The chase kernel ready to launch on a chain: ``launch(n)`` follows ``n`` links
    from where the last launch stopped and returns ns per load (CUDA events)."""

    def __init__(self, chain: _Chain) -> None:
        import numpy as np

        self.mod = Module(chain.ctx, "chase.ptx")
        self.state = DeviceMemory(chain.ctx, 8)  # where the walk is
        self.stream = Stream(chain.ctx)
        self.timer = Timer(self.stream)
        self.state.copy_from_host(np.array([chain.start], dtype=np.uint64))

    def __call__(self, n: int) -> float:
        args = [u64(self.state.ptr), u64(n)]
        return self.timer.time(lambda: self.mod.launch("chase", 1, 1, self.stream, args)) * 1e6 / n

    def __enter__(self) -> _Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.timer.close()
        self.stream.close()
        self.state.close()


class GpuChaser:
    """A GPU's zero-copy chase of host memory on ``node``, timed per launch of
    ``window_loads`` loads: the chaser of a loaded-latency curve from a GPU."""

    window_loads = 4096

    def __init__(self, g: GpuDevice, node: int, size: int | None = None, page: str = "4k") -> None:
        check_size(size)
        self.gpu = g
        self.page_size = page_size(page)
        size = size or default_size(g)
        group = min(TLB_PAGES * self.page_size, 1 << (size.bit_length() - 1))
        self.size = size // group * group
        self._chain = _in_host_memory(GpuContext.of(g), self.size, group, node,
                                      self.page_size)  # fmt: skip
        self._launch = _Launcher(self._chain)
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
        """Release the kernel, the mapping and the memory."""
        self._launch.__exit__()
        self._chain.__exit__()


def _build(address: int, size: int, group: int) -> None:
    ffi, lib = kernels()
    if lib.chase_build(ffi.cast("char *", address), size // STRIDE, STRIDE, group, 0) != 0:
        raise InvalidRequestError(f"cannot build a chase over {size} bytes in groups of {group}")


def _relocate(words: Any, delta: int) -> None:
    """Move every link of the cycle by ``delta`` bytes (host address -> device address)."""
    import numpy as np

    if delta:
        links = words[:: STRIDE // 8]
        links += np.uint64(delta % (1 << 64))  # wraps modulo 2**64, as addresses do


def _in_gpu_memory(ctx: GpuContext, size: int, group: int) -> _Chain:
    import numpy as np

    dev = DeviceMemory(ctx, size)
    host = np.zeros(size // 8, dtype=np.uint64)
    _build(host.ctypes.data, size, group)
    _relocate(host, dev.ptr - host.ctypes.data)
    dev.copy_from_host(host)
    return _Chain(ctx, dev.ptr, [dev])


def _in_host_memory(ctx: GpuContext, size: int, group: int, node: int, psize: int) -> _Chain:
    buf = NumaBuffer(size, Policy.bind(node), huge=huge_pages(psize), populate=False)
    _build(buf.address, size, group)  # the first touch, under the bind policy
    mapped = HostMemory(ctx, buf)
    words = buf.array("uint64")
    _relocate(words, mapped.device_pointer - buf.address)
    del words
    return _Chain(ctx, mapped.device_pointer, [buf, mapped], host=buf)
