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
from ..gpu import driver as drv
from ..gpu.devices import GpuDevice
from ..gpu.kernels import Module
from ..gpu.memory import DeviceMemory, GpuContext, HostMemory
from ..gpu.streams import Stream, Timer
from ..numa.placement import NumaBuffer
from ..numa.policy import Policy
from ..system import System, snapshot
from .context import check_fits, huge_pages, page_size, place, resolve_gpu
from .latency import MIN_SIZE, STRIDE, TLB_PAGES, sweep_sizes
from .results import BenchResult

LOADS = 1 << 18  # per sample: 0.05-0.3 s at GPU memory latencies
WARM_LOADS = 1 << 22  # the first walk covers the cycle (up to 1 GiB arenas)


def default_size(g: GpuDevice) -> int:
    """Four times the GPU's L2 cache, at least 256 MiB."""
    return max(4 * g.l2_cache, 256 << 20)


def gpu_sweep_sizes(gpu: str, top: int | None = None) -> list[int]:
    """Working sets from 16 KiB to twice the GPU's L2 cache."""
    g = resolve_gpu(gpu, snapshot())
    return sweep_sizes(top or 2 * max(g.l2_cache, 1 << 20))


def measure_gpu_latency(
    gpu: str,
    target: str | None = None,
    *,
    size: int | None = None,
    page: str = "4k",
    samples: int = 5,
    loads: int = LOADS,
    system: System | None = None,
) -> BenchResult:
    """Latency of loads from ``gpu`` to its own memory (``target`` None or the same GPU)
    or to host memory on ``target`` (dram0, cxl0, nodeN), mapped for the GPU."""
    began = time.perf_counter()
    if samples < 1:
        raise InvalidRequestError("samples must be at least 1")
    s = system or snapshot()
    g = resolve_gpu(gpu, s)
    gpu_target = s.resolve(target).gpu if target is not None else g
    in_hbm = gpu_target is not None
    if in_hbm and gpu_target != g:
        raise InvalidRequestError(
            f"{gpu} cannot be measured against another GPU's memory ({target}): "
            f"use --target {g.target_name}, or a host tier with --from {g.target_name}"
        )
    psize = 4096 if in_hbm else page_size(page)
    size = max(MIN_SIZE, size or default_size(g))
    group = min(TLB_PAGES * psize, 1 << (size.bit_length() - 1))
    size = size // group * group
    loads = max(16, loads - loads % 16)
    ctx = GpuContext(g.ordinal)
    if in_hbm:
        run = _in_gpu_memory(ctx, size, group)
        node, name, reported_page = None, g.target_name, 0
    else:
        assert target is not None
        p = place(target, None, s)
        check_fits(size, p)
        run = _in_host_memory(ctx, size, group, p.node, psize)
        node, name, reported_page = p.node, p.target, psize
    warm = max(16, min(size // STRIDE, WARM_LOADS) // 16 * 16)
    with run as chain:
        ns = chain.sample(loads, samples, warm)
        placed = chain.pages_by_node()
    params: dict[str, Any] = {
        "loads": loads, "samples": samples, "stride": STRIDE, "tlb_group": group,
        "gpu": g.name, "measure_s": time.perf_counter() - began,
    }  # fmt: skip
    if node is not None:
        params |= {"pages_on_node": placed.get(node, 0), "pages": sum(placed.values())}
    return BenchResult(
        benchmark="latency", target=name, node=node, initiator=g.target_name, cpus=(),
        size=size, page_size=reported_page,
        figures={"latency_ns": min(ns), "latency_ns_median": statistics.median(ns)},
        params=params,
    )  # fmt: skip


class _Chain:
    """A cycle the GPU can follow from ``start``, with what keeps its memory alive."""

    def __init__(self, ctx: GpuContext, start: int, keep: list[Any],
                 host: NumaBuffer | None = None) -> None:  # fmt: skip
        self.ctx, self.start, self.keep, self.host = ctx, start, keep, host

    def sample(self, loads: int, samples: int, warm: int) -> list[float]:
        ffi, lib = drv.driver()
        mod = Module(self.ctx, "chase.ptx")
        state = DeviceMemory(self.ctx, 8)  # where the walk is: each launch goes on from it
        stream = Stream(self.ctx)
        timer = Timer(stream)
        here = ffi.new("unsigned long long *", self.start)
        drv.check("cuMemcpyHtoD", lib.cuMemcpyHtoD_v2(state.ptr, here, 8))
        state_p = ffi.new("unsigned long long *", state.ptr)
        try:

            def launch(n: int) -> float:
                count = ffi.new("unsigned long long *", n)
                return timer.time(lambda: mod.launch("chase", 1, 1, stream.handle,
                                                     [state_p, count]))  # fmt: skip

            launch(warm)  # JIT, TLB and caches warm: the whole cycle once
            return [launch(loads) * 1e6 / loads for _ in range(samples)]
        finally:
            timer.close()
            stream.close()
            state.close()

    def pages_by_node(self) -> dict[int, int]:
        return self.host.pages_by_node() if self.host is not None else {}

    def __enter__(self) -> _Chain:
        return self

    def __exit__(self, *exc: object) -> None:
        for k in reversed(self.keep):
            k.close()


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
    ffi, lib = drv.driver()
    drv.check("cuMemcpyHtoD", lib.cuMemcpyHtoD_v2(dev.ptr, ffi.from_buffer(host), size))
    return _Chain(ctx, dev.ptr, [dev])


def _in_host_memory(ctx: GpuContext, size: int, group: int, node: int, psize: int) -> _Chain:
    buf = NumaBuffer(size, Policy.bind(node), huge=huge_pages(psize), populate=False)
    _build(buf.address, size, group)  # the first touch, under the bind policy
    mapped = HostMemory(ctx, buf)
    words = buf.array("uint64")
    _relocate(words, mapped.device_pointer - buf.address)
    del words
    return _Chain(ctx, mapped.device_pointer, [buf, mapped], host=buf)
