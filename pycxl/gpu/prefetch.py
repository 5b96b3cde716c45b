"""Host memory streamed to a GPU ahead of use: the layer-streaming primitive.

Items (a layer's weights, a shard of optimizer state) live in pinned host memory on a
tier. A small ring of device buffers holds the ones in use and the next ``lookahead``
ones: while the compute stream works on item i, the copy engine fills a free buffer with
item i+1 on a stream of its own. The compute stream waits on an event, never the host;
a buffer is refilled only after an event says the compute stream is done with it.

The order in which items are used is known in advance (layers run 0..n-1; backward
runs them in reverse) and is cyclic (the next step starts again): the ring prefetches
across the end of a pass, and when it must reuse a buffer it evicts the item whose next
use is furthest away, so an item used twice in a row (the last layer at the turn from
forward to backward) is not copied twice.

    ring = Prefetcher(CudaEngine(ctx), sources, lookahead=1)
    for i in range(len(sources)):
        slot = ring.get(i, torch.cuda.current_stream())   # the stream waits, not the host
        ...compute on torch.as_tensor(slot, device="cuda") ...
        ring.done(i, torch.cuda.current_stream())

Results go back the same way: ``copy_back(device_array, host_array, stream)`` copies on a
stream of its own once ``stream`` has produced them, and returns a ``CopyBack`` to wait
on. Streams are any CUDA stream user's (PyTorch, CuPy) or pycxl's own; device memory is
passed as objects with ``__cuda_array_interface__``, never as raw pointers.

This module is the ring's schedule alone: what it needs from a device is the ``Engine``
of ``engine.py``, carried out on a GPU by ``cuda_engine.py`` and on the CPU by
``host_engine.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import InvalidRequestError, OperationError
from ..base.values import lookahead as checked_lookahead
from .engine import CopyBack, Engine, copy_to_host

ALIGN = 256  # device buffer alignment for any dtype (the driver's own is 256 bytes)


@dataclass
class _Slot:
    buffer: Any
    loaded: Any  # event recorded on the copy-in stream after the last fill
    slot_index: int = 0
    item: int | None = None
    users: int = 0
    fresh: bool = False  # filled for its next use (not yet used since)
    # events recorded where the item's users finished with it: a refill waits on them
    released: list[Any] = field(default_factory=list)


@dataclass
class PrefetchStats:
    """What the ring moved: copies into device buffers and their bytes, uses served
    from a buffer already filled (no copy), and copies back."""

    copies_in: int = 0
    bytes_in: int = 0
    reused: int = 0
    copies_out: int = 0
    bytes_out: int = 0


class Prefetcher:
    """Stream ``sources`` (pinned host buffers, arrays or tensors) into a ring of
    ``lookahead + 1`` device buffers (``slots`` to have more), in ``order`` (default:
    0, 1, ..., n-1, then again). ``before_copy(i)``, when given, runs on the host before
    each copy of item i (to wait for an update of its host memory)."""

    def __init__(
        self,
        engine: Engine,
        sources: Sequence[Any],
        *,
        lookahead: int = 1,
        slots: int | None = None,
        order: Sequence[int] | None = None,
        before_copy: Callable[[int], None] | None = None,
    ) -> None:
        if not sources:
            raise InvalidRequestError("nothing to stream: give at least one host buffer")
        lookahead = checked_lookahead(lookahead)
        count = lookahead + 1 if slots is None else slots
        if isinstance(count, bool) or not isinstance(count, int) or count < lookahead + 1:
            raise InvalidRequestError(
                f"slots {slots!r}: a ring with lookahead {lookahead} needs at least "
                f"{lookahead + 1} device buffers"
            )
        self.engine = engine
        self._sources = list(sources)  # kept: the host memory outlives the ring's copies
        self._sizes = [engine.host_span(s)[1] for s in sources]  # checked once, here
        self.lookahead = lookahead
        self.slot_size = max(self._sizes)
        size = -(-self.slot_size // ALIGN) * ALIGN
        self._slots = [_Slot(engine.buffer(size), engine.event(), k) for k in range(count)]
        self._spare_events: list[Any] = []
        self._before_copy = before_copy
        self._order: list[int] = []
        self._position = 0
        self.set_order(range(len(sources)) if order is None else order)
        self.stats = PrefetchStats()

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def order(self) -> tuple[int, ...]:
        """The cyclic order of use the ring prefetches for."""
        return tuple(self._order)

    def set_order(self, order: Sequence[int] | range, position: int = 0) -> None:
        """Prefetch for a new cyclic ``order`` (item indices), starting at
        ``position``; buffers already filled stay usable."""
        items = list(order)
        bad = [i for i in items if not (isinstance(i, int) and 0 <= i < len(self._sizes))]
        if not items or bad:
            raise InvalidRequestError(
                f"order {items!r}: give item indices from 0 to {len(self._sizes) - 1}"
            )
        self._order, self._position = items, position % len(items)

    def get(self, item: int, stream: Any, *, slot_index: int | None = None) -> Any:
        """Item ``item`` in a device buffer for work enqueued on ``stream`` after this
        call (the stream waits for the copy; the host does not). The buffer is the
        item's until ``done(item, stream)``. Items used out of ``order`` are served
        too, at the cost of a copy the ring did not start early. ``slot_index`` asks
        for one buffer in particular (views of it kept from an earlier use read it
        again); it must not be in use."""
        self._check(item)
        self._seek(item)
        slot = self._slot_of(item)
        if slot_index is not None and (slot is None or slot.slot_index != slot_index):
            wanted = self._slots[slot_index]
            if wanted.users:
                raise OperationError(
                    f"device buffer {slot_index} is in use: item {item} cannot go there"
                )
            if slot is not None and not slot.users:
                slot.item = None  # in another buffer: that copy is left unused
            self._fill(wanted, item)
            slot = wanted
        elif slot is None:
            slot = self._victim(protect={item})
            if slot is None:
                raise OperationError(
                    f"all {len(self._slots)} device buffers are in use: call done() "
                    "for an item before getting more than the ring holds"
                )
            self._fill(slot, item)
        elif not slot.fresh:
            self.stats.reused += 1  # still there from an earlier use: no copy
        slot.fresh = False
        slot.users += 1
        self._position = (self._position + 1) % len(self._order)
        self._prefetch()
        self.engine.wait(stream, slot.loaded)
        return self.engine.slot_view(slot.buffer, self._sizes[item])

    def buffer_of(self, item: int) -> int | None:
        """The index of the device buffer holding ``item`` now, if one does."""
        slot = self._slot_of(item)
        return None if slot is None else slot.slot_index

    def done(self, item: int, stream: Any) -> None:
        """``stream`` has enqueued all its work on item ``item``: its buffer may be
        refilled once that work has run."""
        self._check(item)
        slot = self._slot_of(item)
        if slot is None or slot.users == 0:
            raise InvalidRequestError(f"item {item} is not in use: get() it first")
        event = self._spare_events.pop() if self._spare_events else self.engine.event()
        self.engine.record(event, stream)
        slot.released.append(event)
        slot.users -= 1
        self._prefetch()

    def invalidate(self, item: int) -> None:
        """The host copy of ``item`` is about to change: forget the device copy, so the
        next use copies it again (after ``before_copy``)."""
        self._check(item)
        slot = self._slot_of(item)
        if slot is not None:
            if slot.users:
                raise InvalidRequestError(f"item {item} is in use on the device")
            slot.item = None

    def copy_back(self, src: Any, dst: Any, stream: Any) -> CopyBack:
        """``copy_to_host`` on this ring's engine, counted in its stats."""
        back = copy_to_host(self.engine, src, dst, stream)
        self.stats.copies_out += 1
        self.stats.bytes_out += back.nbytes
        return back

    # --- the ring ------------------------------------------------------------------
    def _check(self, item: int) -> None:
        if isinstance(item, bool) or not isinstance(item, int):
            raise InvalidRequestError(f"item {item!r}: give an item index")
        if not 0 <= item < len(self._sizes):
            raise InvalidRequestError(
                f"item {item}: this ring streams items 0 to {len(self._sizes) - 1}"
            )

    def _seek(self, item: int) -> None:
        """Move the position to the next use of ``item`` in the order (if it is there)."""
        n = len(self._order)
        for k in range(n):
            if self._order[(self._position + k) % n] == item:
                self._position = (self._position + k) % n
                return

    def _slot_of(self, item: int) -> _Slot | None:
        return next((s for s in self._slots if s.item == item), None)

    def _upcoming(self) -> list[int]:
        """The next ``lookahead`` items in order that are not in use now."""
        in_use = {s.item for s in self._slots if s.users}
        out: list[int] = []
        n = len(self._order)
        for k in range(n):
            item = self._order[(self._position + k) % n]
            if item in in_use or item in out:
                continue
            if len(out) == self.lookahead:
                break
            out.append(item)
        return out

    def _next_use(self, item: int | None) -> int:
        """How far ahead in the order ``item`` is used next (never: beyond the end)."""
        n = len(self._order)
        if item is None:
            return n + 1
        for k in range(n):
            if self._order[(self._position + k) % n] == item:
                return k
        return n

    def _victim(self, protect: set[int]) -> _Slot | None:
        free = [s for s in self._slots if s.users == 0 and s.item not in protect]
        if not free:
            return None
        return max(free, key=lambda s: self._next_use(s.item))

    def _prefetch(self) -> None:
        upcoming = self._upcoming()
        for item in upcoming:
            if self._slot_of(item) is not None:
                continue
            protect = set(upcoming) | {s.item for s in self._slots if s.users if s.item is not None}
            slot = self._victim(protect)
            if slot is None:
                return
            self._fill(slot, item)

    def _fill(self, slot: _Slot, item: int) -> None:
        if self._before_copy is not None:
            self._before_copy(item)
        copy_in = self.engine.copy_in_stream
        for event in slot.released:
            self.engine.wait(copy_in, event)
        self._spare_events.extend(slot.released)
        slot.released.clear()
        slot.item = None
        size = self._sizes[item]
        self.engine.copy_in(self.engine.slot_view(slot.buffer, size), self._sources[item])
        self.engine.record(slot.loaded, copy_in)
        slot.item, slot.fresh = item, True
        self.stats.copies_in += 1
        self.stats.bytes_in += size

    def close(self) -> None:
        """Wait for copies in flight, then free the device buffers."""
        for slot in self._slots:
            self.engine.synchronize(slot.loaded)
            close = getattr(slot.buffer, "close", None)
            if close is not None:
                close()
        self._slots = []

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
