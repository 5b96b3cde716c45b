"""Copies between pageable host memory and a GPU, pipelined through pinned buffers.

The driver copies pageable memory through its own small staging buffers, one chunk at a
time, with one CPU thread: 7-22 GB/s on the GPU machine, where pinned memory moves 55.
Here a pool of pinned CPU threads (native/copy.c) fills pinned staging buffer i while
the copy engine moves buffer i-1 to the GPU (or drains buffer i into pageable memory
while the engine fills buffer i+1), so the CPU copy and the DMA overlap and neither
waits for the other. The threads run from chunk to chunk without a barrier (a copy
stream): this thread only opens chunks whose buffers are free and hands finished chunks
to the engine, so a preempted copy thread on a busy host delays one slice, not all.

    with StagedCopier(ctx, node=gpu.numa_node) as copier:
        copier.to_device(device_memory, numpy_array)
        copier.to_host(numpy_array, device_memory)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..base._lib.compiled import CopyTeam, Transfer
from ..base.errors import InvalidRequestError
from ..numa import pages
from ..numa.placement import NumaBuffer
from ..numa.policy import Policy
from . import driver as drv
from .context import GpuContext
from .memory import HostMemory
from .streams import Event, Stream

# From benchmarks/pinned_vs_torch.py --tune on the GPU machine (1 GiB, 55 GB/s link,
# 16 cores, 300 MiB L3), with the copy stream: 12 threads, four 16 MiB staging buffers
# (they stay in the cache), non-temporal stores into pageable memory and plain ones
# into the staging buffers gave 53.2 GB/s h2d and 54.0 GB/s d2h (medians). 16 threads
# on 16 cores gave h2d 48-52 (the thread driving the stream shares a core with one of
# them); plain stores into pageable memory dropped d2h to 48-53; 8 MiB chunks were
# less steady.
CHUNK = 16 << 20
DEPTH = 4
MAX_THREADS = 12
NT_TO_HOST = True
NT_TO_DEVICE = False


class StagedCopier:
    """``depth`` pinned staging buffers of ``chunk`` bytes (on ``node`` when given) and
    a pool of copy threads (on ``cpus``, default: up to 12 CPUs this process may use).
    ``nt_to_host``/``nt_to_device``: the threads write the destination with
    non-temporal stores (no read of each destination line first, no eviction of the
    staging buffers from the cache)."""

    def __init__(
        self,
        ctx: GpuContext,
        *,
        chunk: int = CHUNK,
        depth: int = DEPTH,
        cpus: Sequence[int] | None = None,
        node: int | None = None,
        nt_to_host: bool = NT_TO_HOST,
        nt_to_device: bool = NT_TO_DEVICE,
    ) -> None:
        if chunk < pages.PAGE or chunk % pages.PAGE:
            raise InvalidRequestError(f"chunk must be a positive multiple of {pages.PAGE} bytes")
        if depth < 2:
            raise InvalidRequestError("depth must be at least 2 (one buffer fills, one moves)")
        allowed = sorted(os.sched_getaffinity(0))
        cpus = list(cpus) if cpus is not None else allowed[:MAX_THREADS]
        if not cpus or any(c not in allowed for c in cpus):
            raise InvalidRequestError(f"copy threads need CPUs this process may use: {allowed}")
        self.ctx = ctx
        self.chunk = chunk
        self.nt_to_host, self.nt_to_device = nt_to_host, nt_to_device
        policy = Policy.bind(node) if node is not None else Policy.default()
        self._buffers = [NumaBuffer(chunk, policy) for _ in range(depth)]
        self._pinned = [HostMemory(ctx, b) for b in self._buffers]
        self._events = [Event() for _ in range(depth)]
        ffi, _ = drv.driver()
        self._stage = [ffi.cast("void *", b.address) for b in self._buffers]  # for the driver
        self.stream = Stream(ctx)
        self._pool = CopyTeam(cpus)
        self.threads = len(cpus)

    def to_device(self, dst: Any, src: Any) -> None:
        """Copy all of ``src`` (any buffer or array) into the GPU memory ``dst``
        (DeviceMemory, or any CUDA array at least as large)."""
        address, size = pages.buffer_span(src)
        dptr = _device_start(dst, size)
        _, cu = drv.driver()
        self.ctx.activate()
        depth, chunks = len(self._buffers), -(-size // self.chunk)
        # The threads fill the first `depth` buffers at once; buffer i % depth opens for
        # chunk i + depth when the engine has read chunk i.
        with self._stream(address, size, to_host=False, opened=depth) as copy:
            for i in range(chunks):
                copy.wait(i)
                b, off = i % depth, i * self.chunk
                n = min(self.chunk, size - off)
                rc = cu.cuMemcpyHtoDAsync_v2(dptr + off, self._stage[b], n, self.stream.handle)
                drv.check("cuMemcpyHtoDAsync", rc)
                self._events[b].record(self.stream)
                if i and i - 1 + depth < chunks:
                    self._events[(i - 1) % depth].synchronize()
                    copy.open(i + depth)
            self.stream.synchronize()

    def to_host(self, dst: Any, src: Any) -> None:
        """Copy ``len(dst)`` bytes from the GPU memory ``src`` (DeviceMemory, or any CUDA
        array at least as large) into ``dst`` (writable)."""
        address, size = pages.buffer_span(dst)
        dptr = _device_start(src, size)
        _, cu = drv.driver()
        self.ctx.activate()
        depth, chunks = len(self._buffers), -(-size // self.chunk)

        def fetch(i: int) -> None:
            b, off = i % depth, i * self.chunk
            rc = cu.cuMemcpyDtoHAsync_v2(self._stage[b], dptr + off, min(self.chunk, size - off),
                                         self.stream.handle)  # fmt: skip
            drv.check("cuMemcpyDtoHAsync", rc)
            self._events[b].record(self.stream)

        for i in range(min(depth, chunks)):
            fetch(i)
        # Chunk i opens to the threads when the engine has filled its buffer; the buffer
        # takes chunk i + depth when the threads have drained it.
        with self._stream(address, size, to_host=True, opened=0) as copy:
            for i in range(chunks):
                self._events[i % depth].synchronize()
                copy.open(i + 1)
                if i and i - 1 + depth < chunks:
                    copy.wait(i - 1)
                    fetch(i - 1 + depth)
        self.stream.synchronize()

    def _stream(self, address: int, size: int, *, to_host: bool,
                opened: int) -> AbstractContextManager[Transfer]:  # fmt: skip
        nt = self.nt_to_host if to_host else self.nt_to_device
        return self._pool.transfer(address, [b.address for b in self._buffers], size, self.chunk,
                                 to_host=to_host, nt=nt, opened=opened)  # fmt: skip

    def close(self) -> None:
        """Stop the copy threads, unregister and free the staging buffers."""
        self._pool.close()
        self.stream.close()
        for e in self._events:
            e.close()
        for p in self._pinned:
            p.close()
        for b in self._buffers:
            b.close()

    def __enter__(self) -> StagedCopier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _device_start(memory: Any, size: int) -> int:
    """The device address of ``memory``, which must hold ``size`` bytes."""
    from .spans import device_span

    address, n = device_span(memory)
    if n < size:
        raise InvalidRequestError(f"{size} bytes do not fit in {n} bytes of GPU memory")
    return address
