"""The ring's engine on a GPU (``engine.Engine``): device buffers from the driver, one
stream for copies to the device and one for copies back, and pinned host memory only."""

from __future__ import annotations

import threading
from typing import Any

from ..base.errors import InvalidRequestError
from .engine import Engine, same_size, within
from .spans import device_span, host_span


class DeviceView:
    """``nbytes`` bytes at the start of a device buffer, as a 1-D byte array for any
    CUDA array library (``__cuda_array_interface__``); ``slot`` tells the buffers apart,
    so a caller can wrap each buffer once and slice it."""

    def __init__(self, buffer: Any, slot: int, nbytes: int) -> None:
        self._buffer, self.slot, self.nbytes = buffer, slot, nbytes

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The bytes as a 1-D array; ordering is the ring's events' job."""
        from .memory import byte_array_interface

        return byte_array_interface(device_span(self._buffer)[0], self.nbytes)


class CudaEngine(Engine):
    """The ring's engine on a GPU: device buffers from the driver, one stream for copies
    to the device and one for copies back (the link carries both directions at once)."""

    def __init__(self, ctx: Any) -> None:
        from .streams import Stream

        self.ctx = ctx
        self._in = Stream(ctx)
        self._out = Stream(ctx)
        self._slots = 0
        self._threads = threading.local()

    def _current(self) -> None:
        """The context current on this thread (hooks of a backward pass and optimizer
        workers call from threads of their own)."""
        if not getattr(self._threads, "ready", False):
            self.ctx.activate()
            self._threads.ready = True

    @property
    def copy_in_stream(self) -> Any:
        """The engine's stream for copies to the device."""
        return self._in

    @property
    def copy_out_stream(self) -> Any:
        """The engine's stream for copies to the host."""
        return self._out

    def buffer(self, size: int) -> Any:
        from .memory import DeviceMemory

        mem = DeviceMemory(self.ctx, size)
        mem.slot = self._slots  # type: ignore[attr-defined]
        self._slots += 1
        return mem

    def slot_view(self, buffer: Any, nbytes: int) -> DeviceView:
        return DeviceView(buffer, buffer.slot, within(nbytes, buffer.size))

    def host_span(self, obj: Any) -> tuple[int, int]:
        self._current()  # the pinned check asks the driver, from whichever thread calls
        address, n = host_span(obj)
        _check_pinned(address, n)
        return address, n

    def event(self) -> Any:
        from .streams import Event

        self._current()
        return Event(timing=False)

    def record(self, event: Any, stream: Any) -> None:
        from .streams import Stream

        self._current()
        event.record(Stream.borrow(stream))

    def wait(self, stream: Any, event: Any) -> None:
        from .streams import Stream

        self._current()
        Stream.borrow(stream).wait(event)

    def copy_in(self, dst: Any, src: Any) -> None:
        from . import driver as drv

        d, s = device_span(dst), self.host_span(src)  # the context made current there
        n = same_size(d, s)
        ffi, lib = drv.driver()
        rc = lib.cuMemcpyHtoDAsync_v2(d[0], ffi.cast("void *", s[0]), n, self._in.handle)
        drv.check("cuMemcpyHtoDAsync", rc)

    def copy_out(self, dst: Any, src: Any) -> None:
        from . import driver as drv

        d, s = self.host_span(dst), device_span(src)  # the context made current there
        n = same_size(d, s)
        ffi, lib = drv.driver()
        rc = lib.cuMemcpyDtoHAsync_v2(ffi.cast("void *", d[0]), s[0], n, self._out.handle)
        drv.check("cuMemcpyDtoHAsync", rc)

    def synchronize(self, event: Any) -> None:
        self._current()
        event.synchronize()


def _check_pinned(address: int, n: int) -> None:
    from . import driver as drv

    ffi, lib = drv.driver()
    flags = ffi.new("unsigned int *")
    for a in {address, address + max(n - 1, 0)}:
        if lib.cuMemHostGetFlags(flags, ffi.cast("void *", a)) != 0:
            raise InvalidRequestError(
                f"host memory at {a:#x} is not pinned for the GPU: make it with "
                "pycxl.pinned_tensor, pycxl.pinned_array or pycxl.host_memory (copies "
                "from pageable memory would not overlap with compute)"
            )
