"""What the ring (``prefetch.Prefetcher``) and the offloads need from a device: the
``Engine`` protocol (buffers, copies on two streams of its own, events that order them
against the caller's streams), and the copies every engine does the same way on top of
it (``copy_to_host``, ``copy_to_device``). Engines: ``cuda_engine.CudaEngine`` on a GPU,
``host_engine.HostEngine`` on the CPU.

Copies take the objects that hold the memory (tensors and their slices, arrays, the
ring's views), never addresses: an engine finds where they are, checks that the two
sides are as large and that host memory is what it can copy from, and copies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..base.errors import InvalidRequestError


class Engine(Protocol):
    """What the ring needs from a device: buffers, copies on its own two streams
    (``copy_in``: host to device; ``copy_out``: device to host), and events that order
    them against the caller's streams."""

    def buffer(self, size: int) -> Any:
        """A device buffer of ``size`` bytes (with a ``slot`` number, from 0)."""
        ...

    def slot_view(self, buffer: Any, nbytes: int) -> Any:
        """What ``Prefetcher.get`` hands out: the first ``nbytes`` of ``buffer`` (refused
        where the buffer is smaller)."""
        ...

    def host_span(self, obj: Any) -> tuple[int, int]:
        """(address, bytes) of host memory the engine can copy from and to (refused
        where it cannot: pageable memory on a GPU); the engine's own business, and a
        caller's only to check memory once, up front."""
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

    def copy_in(self, dst: Any, src: Any) -> None:
        """Enqueue a copy of host memory ``src`` into device memory ``dst`` (as many
        bytes: a tensor or its slice, an array, a ring view) on the copy-in stream."""
        ...

    def copy_out(self, dst: Any, src: Any) -> None:
        """Enqueue a copy of device memory ``src`` into host memory ``dst`` (as many
        bytes) on the copy-out stream."""
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


def same_size(dst: tuple[int, int], src: tuple[int, int]) -> int:
    """The bytes a copy moves: ``src``'s, refused where ``dst`` is not as large."""
    if dst[1] != src[1]:
        raise InvalidRequestError(f"a copy of {src[1]} bytes into {dst[1]} bytes")
    return src[1]


def within(nbytes: int, size: int) -> int:
    """``nbytes`` of a buffer of ``size`` bytes, refused where they do not fit (a view
    past the buffer's end would let a copy run over the memory beyond it)."""
    if not 0 <= nbytes <= size:
        raise InvalidRequestError(f"a view of {nbytes} bytes of a buffer of {size} bytes")
    return nbytes


def copy_to_host(engine: Engine, src: Any, dst: Any, stream: Any) -> CopyBack:
    """Copy device memory ``src`` (a CUDA tensor, ``__cuda_array_interface__``) into host
    memory ``dst`` once the work enqueued on ``stream`` so far has run, on the engine's
    copy-out stream; the returned ``CopyBack`` waits for it."""
    produced = engine.event()
    engine.record(produced, stream)
    engine.wait(engine.copy_out_stream, produced)
    engine.copy_out(dst, src)
    landed = engine.event()
    engine.record(landed, engine.copy_out_stream)
    return CopyBack(engine, landed, keep=(src, dst), nbytes=_nbytes(src))


def copy_to_device(engine: Engine, srcs: Sequence[Any], dsts: Sequence[Any]) -> Any:
    """Copy each piece of host memory of ``srcs`` into the device memory beside it in
    ``dsts`` on the engine's copy-in stream; returns the event that follows them, for a
    stream to wait on."""
    if len(srcs) != len(dsts):
        raise InvalidRequestError(f"{len(srcs)} sources for {len(dsts)} destinations")
    for src, dst in zip(srcs, dsts, strict=True):
        engine.copy_in(dst, src)
    done = engine.event()
    engine.record(done, engine.copy_in_stream)
    return done


def _nbytes(obj: Any) -> int:
    """Bytes of a tensor or array (what a CopyBack reports it moved)."""
    if hasattr(obj, "element_size"):
        return int(obj.numel() * obj.element_size())
    return int(obj.nbytes)
