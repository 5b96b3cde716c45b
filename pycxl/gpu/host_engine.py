"""The ring's engine on the CPU (``engine.Engine``): training on CPUs, and the ring's
logic on machines without a GPU."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from .engine import Engine, same_size, within
from .spans import host_span


class HostEngine(Engine):
    """The ring's engine when the 'device' is the CPU (training on CPUs, and the
    ring's logic on machines without a GPU): buffers in host memory, copies done at
    once, events that are always complete."""

    copy_in_stream: Any = None
    copy_out_stream: Any = None

    def __init__(self) -> None:
        self._slots = 0

    def buffer(self, size: int) -> Any:
        buf = _HostBuffer(size, self._slots)
        self._slots += 1
        return buf

    def slot_view(self, buffer: Any, nbytes: int) -> HostView:
        within(nbytes, len(buffer.data))
        memory = memoryview(buffer.data).cast("B")[:nbytes]
        return HostView(memory, buffer.slot, nbytes, ctypes.addressof(buffer.data))

    def host_span(self, obj: Any) -> tuple[int, int]:
        if isinstance(obj, HostView):
            return obj.address, obj.nbytes
        return host_span(obj)

    def event(self) -> Any:
        return None

    def record(self, event: Any, stream: Any) -> None:
        pass

    def wait(self, stream: Any, event: Any) -> None:
        pass

    def copy_in(self, dst: Any, src: Any) -> None:
        d, s = self.host_span(dst), self.host_span(src)
        ctypes.memmove(d[0], s[0], same_size(d, s))

    def copy_out(self, dst: Any, src: Any) -> None:
        self.copy_in(dst, src)  # both sides are host memory

    def synchronize(self, event: Any) -> None:
        pass


@dataclass(frozen=True)
class HostView:
    """``nbytes`` bytes at the start of a HostEngine buffer (``memory``, at
    ``address``), and which buffer (``slot``)."""

    memory: memoryview
    slot: int
    nbytes: int
    address: int


class _HostBuffer:
    def __init__(self, size: int, slot: int) -> None:
        self.data = (ctypes.c_ubyte * size)()
        self.slot = slot

    def span(self) -> tuple[int, int]:
        return ctypes.addressof(self.data), len(self.data)
