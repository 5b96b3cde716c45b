"""CUDA streams and event timers of the driver API, released deterministically."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from ..base.errors import InvalidRequestError
from . import driver as drv
from .context import GpuContext

CU_STREAM_NON_BLOCKING = 1
CU_EVENT_DISABLE_TIMING = 2
CUDA_ERROR_NOT_READY = 600


class Stream:
    """A non-blocking stream in ``ctx`` (it does not wait for the legacy stream)."""

    _destroy: Callable[[], Any]

    def __init__(self, ctx: GpuContext) -> None:
        ctx.activate()
        ffi, lib = drv.driver()
        s = ffi.new("CUstream *")
        drv.check("cuStreamCreate", lib.cuStreamCreate(s, CU_STREAM_NON_BLOCKING))
        self.ctx: GpuContext | None = ctx
        self.handle = s[0]
        self._destroy = weakref.finalize(self, lib.cuStreamDestroy_v2, self.handle)

    @classmethod
    def borrow(cls, stream: Any) -> Stream:
        """Another library's stream, used and never destroyed here: a PyTorch stream
        (``.cuda_stream``), a CuPy stream (``.ptr``), a ``Stream``, or a raw handle
        (an int; 0 is the legacy default stream)."""
        if isinstance(stream, Stream):
            return stream
        handle = getattr(stream, "cuda_stream", None)
        if handle is None:
            handle = getattr(stream, "ptr", stream)
        if not isinstance(handle, int) or isinstance(handle, bool) or handle < 0:
            raise InvalidRequestError(
                f"{stream!r} is not a CUDA stream: pass a torch.cuda.Stream, a CuPy "
                "stream, a pycxl Stream or a stream handle"
            )
        ffi, _ = drv.driver()
        self = cls.__new__(cls)
        self.ctx = None
        self.handle = ffi.cast("CUstream", handle)
        self._destroy = _borrowed
        return self

    @property
    def address(self) -> int:
        """The handle as a number (what ``torch.cuda.ExternalStream`` takes)."""
        ffi, _ = drv.driver()
        return int(ffi.cast("uintptr_t", self.handle))

    def synchronize(self) -> None:
        """Wait until everything enqueued on the stream is done."""
        _, lib = drv.driver()
        drv.check("cuStreamSynchronize", lib.cuStreamSynchronize(self.handle))

    def wait(self, event: Event) -> None:
        """Later work on this stream waits for ``event`` (recorded on any stream)."""
        _, lib = drv.driver()
        drv.check("cuStreamWaitEvent", lib.cuStreamWaitEvent(self.handle, event.handle, 0))

    def close(self) -> None:
        """Destroy the stream (idempotent)."""
        self._destroy()


def _borrowed() -> None:
    """A borrowed stream belongs to its library: nothing to destroy."""


class Event:
    """A CUDA event, with timing unless ``timing`` is False (cheaper to record and
    wait on, for ordering only)."""

    def __init__(self, timing: bool = True) -> None:
        ffi, lib = drv.driver()
        e = ffi.new("CUevent *")
        flags = 0 if timing else CU_EVENT_DISABLE_TIMING
        drv.check("cuEventCreate", lib.cuEventCreate(e, flags))
        self.handle = e[0]
        self._destroy = weakref.finalize(self, lib.cuEventDestroy_v2, self.handle)

    def record(self, stream: Stream) -> None:
        """Record the event on ``stream`` (after what is enqueued there)."""
        _, lib = drv.driver()
        drv.check("cuEventRecord", lib.cuEventRecord(self.handle, stream.handle))

    def synchronize(self) -> None:
        """Wait until the event has completed."""
        _, lib = drv.driver()
        drv.check("cuEventSynchronize", lib.cuEventSynchronize(self.handle))

    def done(self) -> bool:
        """Whether the work before the event's last record has completed."""
        _, lib = drv.driver()
        rc = int(lib.cuEventQuery(self.handle))
        if rc == CUDA_ERROR_NOT_READY:
            return False
        drv.check("cuEventQuery", rc)
        return True

    def ms_since(self, start: Event) -> float:
        """GPU time from ``start`` to this event, once this event has completed."""
        ffi, lib = drv.driver()
        ms = ffi.new("float *")
        drv.check("cuEventElapsedTime", lib.cuEventElapsedTime(ms, start.handle, self.handle))
        return float(ms[0])

    def close(self) -> None:
        """Destroy the event (idempotent)."""
        self._destroy()


class Timer:
    """Two events around work enqueued on one stream: its GPU time in ms."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.start, self.end = Event(), Event()

    def time(self, work: Callable[[], Any]) -> float:
        """GPU milliseconds of what ``work`` enqueues on the stream."""
        self.start.record(self.stream)
        work()
        self.end.record(self.stream)
        self.end.synchronize()
        return self.end.ms_since(self.start)

    def close(self) -> None:
        """Destroy both events."""
        self.start.close()
        self.end.close()
