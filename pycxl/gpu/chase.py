"""The GPU's pointer chase (native/chase.ptx): one GPU thread follows a cycle of links
through the GPU's own memory, or through host memory on a node mapped for the GPU
(zero-copy: each load crosses the link to the host).

The cycle is the CPU chase's (the native chase builder: one line every ``stride``
bytes, random order inside groups), built on the host and moved to device addresses
here, so the device pointers it takes stay inside this package. Each launch goes on
where the last one stopped and is timed by CUDA events.
"""

from __future__ import annotations

from typing import Any

from ..base._lib import compiled
from ..numa.placement import HugePages, NumaBuffer
from ..numa.policy import Policy
from .context import GpuContext
from .memory import DeviceMemory, HostMemory
from .ptx import Module, pointer, u64
from .spans import device_span
from .streams import Stream, Timer


class Chain:
    """A cycle the GPU can follow from the start of ``start`` (device memory, or host
    memory mapped for the GPU), with what keeps its memory alive."""

    def __init__(self, ctx: GpuContext, start: Any, keep: list[Any],
                 host: NumaBuffer | None = None) -> None:  # fmt: skip
        self.ctx, self.start, self.keep, self.host = ctx, start, keep, host

    def sample(self, loads: int, samples: int, warm: int) -> list[float]:
        """ns per load of ``samples`` launches of ``loads`` loads, after one of ``warm``."""
        with Launcher(self) as launch:
            launch(warm)  # JIT, TLB and caches warm: the whole cycle once
            return [launch(loads) for _ in range(samples)]

    def pages_by_node(self) -> dict[int, int]:
        """Pages of the chased host memory per node (none for GPU memory)."""
        return self.host.pages_by_node() if self.host is not None else {}

    def close(self) -> None:
        """Release the memory and its mapping."""
        for k in reversed(self.keep):
            k.close()

    def __enter__(self) -> Chain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Launcher:
    """The chase ready to launch on a chain: ``launch(n)`` follows ``n`` links from where
    the last launch stopped and returns ns per load (CUDA events)."""

    def __init__(self, chain: Chain) -> None:
        import numpy as np

        self.mod = Module(chain.ctx, "chase.ptx")
        self.state = DeviceMemory(chain.ctx, 8)  # where the walk is
        self.stream = Stream(chain.ctx)
        self.timer = Timer(self.stream)
        start, _ = device_span(chain.start)
        self.state.copy_from_host(np.array([start], dtype=np.uint64))

    def __call__(self, n: int) -> float:
        args = [pointer(self.state), u64(n)]
        return self.timer.time(lambda: self.mod.launch("chase", 1, 1, self.stream, args)) * 1e6 / n

    def close(self) -> None:
        """Release the stream, its timer and the walk's state."""
        self.timer.close()
        self.stream.close()
        self.state.close()

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _relocate(words: Any, stride: int, delta: int) -> None:
    """Move every link of the cycle by ``delta`` bytes (host address -> device address)."""
    import numpy as np

    if delta:
        links = words[:: stride // 8]
        links += np.uint64(delta % (1 << 64))  # wraps modulo 2**64, as addresses do


def in_gpu_memory(ctx: GpuContext, size: int, stride: int, group: int) -> Chain:
    """A cycle over ``size`` bytes of the GPU's own memory."""
    import numpy as np

    dev = DeviceMemory(ctx, size)
    host = np.zeros(size // 8, dtype=np.uint64)
    compiled.chase_build(host.ctypes.data, size, stride, group)
    _relocate(host, stride, device_span(dev)[0] - host.ctypes.data)
    dev.copy_from_host(host)
    return Chain(ctx, dev, [dev])


def in_host_memory(ctx: GpuContext, size: int, stride: int, group: int, node: int,
                   huge: HugePages) -> Chain:  # fmt: skip
    """A cycle over ``size`` bytes bound to ``node``, registered and mapped for the GPU."""
    buf = NumaBuffer(size, Policy.bind(node), huge=huge, populate=False)
    compiled.chase_build(buf.address, size, stride, group)  # the first touch, under the bind
    mapped = HostMemory(ctx, buf)
    words = buf.array("uint64")
    _relocate(words, stride, device_span(mapped)[0] - buf.address)
    del words
    return Chain(ctx, mapped, [buf, mapped], host=buf)
