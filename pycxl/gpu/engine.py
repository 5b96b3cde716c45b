"""What the ring (``prefetch.Prefetcher``) and the offloads need from a device: the
``Engine`` protocol (buffers, copies on two streams of its own, events that order them
against the caller's streams), and the copies every engine does the same way on top of
it (``copy_to_host``, ``copy_to_device``). Engines: ``cuda_engine.CudaEngine`` on a GPU,
``host_engine.HostEngine`` on the CPU."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..errors import InvalidRequestError


class Engine(Protocol):
    """What the ring needs from a device: buffers, copies on its own two streams
    (``copy_in``: host to device; ``copy_out``: device to host), and events that order
    them against the caller's streams."""

    def buffer(self, size: int) -> Any:
        """A device buffer of ``size`` bytes (with a ``slot`` number, from 0)."""
        ...

    def slot_view(self, buffer: Any, nbytes: int) -> Any:
        """What ``Prefetcher.get`` hands out: the first ``nbytes`` of ``buffer``."""
        ...

    def host_span(self, obj: Any) -> tuple[int, int]:
        """(address, bytes) of host memory the engine can copy from and to."""
        ...

    def device_span(self, obj: Any) -> tuple[int, int]:
        """(address, bytes) of device memory (a buffer, an array, a tensor)."""
        ...

    def event(self) -> Any:
        """A new event, for ordering."""
        ...

    def record(self, event: Any, stream: Any) -> None:
        """Record ``event`` after the work enqueued on ``stream`` so far."""
        ...

    def wait(self, stream: Any, event: Any) -> None:
        """Work enqueued on ``stream`` from now on waits for ``event``'s last record."""
        ...

    def copy_in(self, dst: tuple[int, int], src: tuple[int, int]) -> None:
        """Enqueue a copy from host ``src`` to device ``dst`` on the copy-in stream."""
        ...

    def copy_out(self, dst: tuple[int, int], src: tuple[int, int]) -> None:
        """Enqueue a copy from device ``src`` to host ``dst`` on the copy-out stream."""
        ...

    def synchronize(self, event: Any) -> None:
        """Block the host until ``event``'s last record has completed."""
        ...

    @property
    def copy_in_stream(self) -> Any:
        """The stream copies to the device run on."""
        ...

    @property
    def copy_out_stream(self) -> Any:
        """The stream copies to the host run on."""
        ...


class CopyBack:
    """A copy from the device to the host in flight; ``wait()`` returns once the host
    memory holds it. The source stays referenced until then, so its memory cannot be
    reused under the copy."""

    def __init__(self, engine: Engine, event: Any, keep: Any, nbytes: int) -> None:
        self._engine, self._event, self._keep = engine, event, keep
        self.nbytes = nbytes

    def wait(self) -> None:
        """Block until the copy has landed in host memory."""
        if self._keep is not None:
            self._engine.synchronize(self._event)
            self._keep = None


def copy_to_host(engine: Engine, src: Any, dst: Any, stream: Any) -> CopyBack:
    """Copy device memory ``src`` (``__cuda_array_interface__``) into host memory
    ``dst`` once the work enqueued on ``stream`` so far has run, on the engine's
    copy-out stream; the returned ``CopyBack`` waits for it."""
    s_addr, s_len = engine.device_span(src)
    d_addr, d_len = engine.host_span(dst)
    if s_len != d_len:
        raise InvalidRequestError(f"copy back of {s_len} bytes into {d_len} bytes")
    produced = engine.event()
    engine.record(produced, stream)
    engine.wait(engine.copy_out_stream, produced)
    engine.copy_out((d_addr, d_len), (s_addr, s_len))
    landed = engine.event()
    engine.record(landed, engine.copy_out_stream)
    return CopyBack(engine, landed, keep=(src, dst), nbytes=s_len)


def copy_to_device(engine: Engine, src: Any, dsts: Sequence[Any], offsets: Sequence[int]) -> Any:
    """Copy the pieces of host memory ``src`` at ``offsets`` into the device arrays
    ``dsts`` (each as many bytes as it holds) on the engine's copy-in stream; returns
    the event that follows them, for a stream to wait on."""
    base, length = engine.host_span(src)
    for dst, offset in zip(dsts, offsets, strict=True):
        d_addr, n = engine.device_span(dst)
        if offset < 0 or offset + n > length:
            raise InvalidRequestError(f"{n} bytes at offset {offset} run past {length} bytes")
        engine.copy_in((d_addr, n), (base + offset, n))
    done = engine.event()
    engine.record(done, engine.copy_in_stream)
    return done
