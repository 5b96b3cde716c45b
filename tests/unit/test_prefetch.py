"""The layer-streaming ring (pycxl.gpu.prefetch) on a machine without a GPU.

The ring's job is ordering: a copy into a device buffer must wait until the compute
stream is done with what the buffer held, and the compute stream must wait until the
copy has landed. Here streams are simulated: every operation is queued on its stream
and run later, in an order chosen to break a missing wait: copies as late as possible
(a use that does not wait for its copy reads stale bytes) or as early as possible (a
refill that does not wait for the last use overwrites bytes still to be read). The
GPU tests (tests/gpu/test_gpu_offload.py) run the same protocol on the CUDA driver.
"""

from __future__ import annotations

import ctypes
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pycxl.base.errors import InvalidRequestError, OperationError
from pycxl.gpu.host_engine import HostEngine
from pycxl.gpu.prefetch import Prefetcher
from pycxl.gpu.spans import host_span
from pycxl.measure.results import bench_result_json


class _Record:
    done = False


class SimEvent:
    def __init__(self) -> None:
        self.last: _Record | None = None


class SimBuffer:
    def __init__(self, size: int, slot: int) -> None:
        self.data = (ctypes.c_ubyte * size)()
        self.slot = slot

    def span(self) -> tuple[int, int]:
        return ctypes.addressof(self.data), len(self.data)


class SimEngine:
    """Streams as queues of operations, run by ``drain`` copies-last or copies-first."""

    def __init__(self) -> None:
        self.queues: dict[str, deque[tuple[str, Any]]] = {}
        self.copy_in_stream, self.copy_out_stream = "in", "out"
        self._slots = 0

    def buffer(self, size: int) -> SimBuffer:
        self._slots += 1
        return SimBuffer(size, self._slots - 1)

    def slot_view(self, buffer: SimBuffer, nbytes: int) -> tuple[SimBuffer, int]:
        return buffer, nbytes

    host_span = staticmethod(host_span)

    def event(self) -> SimEvent:
        return SimEvent()

    def _q(self, stream: str) -> deque[tuple[str, Any]]:
        return self.queues.setdefault(stream, deque())

    def record(self, event: SimEvent, stream: str) -> None:
        rec = _Record()
        event.last = rec
        self._q(stream).append(("record", rec))

    def wait(self, stream: str, event: SimEvent) -> None:
        if event.last is not None:  # as CUDA: waits for the record made before the call
            self._q(stream).append(("wait", event.last))

    def copy_in(self, dst: tuple[SimBuffer, int], src: Any) -> None:
        buffer, nbytes = dst  # a slot view
        (to, _), (at, n) = buffer.span(), host_span(src)
        assert n == nbytes

        def run() -> None:  # reads the source when it runs, as a DMA does
            ctypes.memmove(to, at, n)

        self._q("in").append(("op", run))

    def copy_out(self, dst: Any, src: Any) -> None:
        raise AssertionError("not used here")

    def kernel(self, stream: str, fn: Callable[[], None]) -> None:
        self._q(stream).append(("op", fn))

    def synchronize(self, event: SimEvent) -> None:
        self.drain("copies-first")
        assert event.last is None or event.last.done

    def drain(self, policy: str) -> None:
        """Run every queue to its end; at each step run one operation of the first
        stream (in the policy's preference) whose head can run."""
        copies = ["in", "out"]
        others = sorted(q for q in self.queues if q not in copies)
        prefer = others + copies if policy == "copies-last" else copies + others
        while any(self.queues.values()):
            for name in prefer:
                q = self.queues.get(name)
                if not q:
                    continue
                kind, what = q[0]
                if kind == "wait" and not what.done:
                    continue
                q.popleft()
                if kind == "record":
                    what.done = True
                elif kind == "op":
                    what()
                break
            else:
                raise AssertionError("deadlock: every stream waits")


def _sources(n: int, size: int = 4096) -> list[np.ndarray]:
    return [np.full(size + 64 * i, i + 1, dtype=np.uint8) for i in range(n)]


def _run(ring: Prefetcher, engine: SimEngine, order: list[int], policy: str) -> list[tuple]:
    seen: list[tuple[int, set[int], int]] = []
    for item in order:
        buf, nbytes = ring.get(item, "compute")

        def read(item: int = item, buf: SimBuffer = buf, nbytes: int = nbytes) -> None:
            seen.append((item, set(bytes(buf.data)[:nbytes]), nbytes))

        engine.kernel("compute", read)
        ring.done(item, "compute")
    engine.drain(policy)
    return seen


FORWARD = list(range(6))
TRAIN = FORWARD + FORWARD[::-1]


@pytest.mark.parametrize("policy", ["copies-last", "copies-first"])
@pytest.mark.parametrize("lookahead", [0, 1, 2])
@pytest.mark.parametrize("order", [FORWARD, TRAIN], ids=["forward", "forward+backward"])
def test_every_use_reads_its_own_item_whatever_the_streams_do(
    policy: str, lookahead: int, order: list[int]
) -> None:
    engine = SimEngine()
    src = _sources(6)
    ring = Prefetcher(engine, src, lookahead=lookahead, order=order)  # type: ignore[arg-type]
    seen = _run(ring, engine, order * 3, policy)
    assert [(i, vals, n) for i, vals, n in seen] == [(i, {i + 1}, src[i].nbytes) for i in order * 3]


@pytest.mark.parametrize(
    ("dropped", "policy"),
    [
        ("compute", "copies-last"),  # a use that does not wait for its copy reads stale bytes
        ("in", "copies-first"),  # a refill that does not wait for the last use overwrites
    ],
)
def test_the_simulation_catches_a_missing_wait(
    monkeypatch: pytest.MonkeyPatch, dropped: str, policy: str
) -> None:
    engine = SimEngine()
    ring = Prefetcher(engine, _sources(4), lookahead=1)  # type: ignore[arg-type]
    real_wait = engine.wait
    monkeypatch.setattr(engine, "wait", lambda s, e: None if s == dropped else real_wait(s, e))
    seen = _run(ring, engine, [0, 1, 2, 3] * 2, policy)
    assert any(vals != {i + 1} for i, vals, _ in seen)


def test_forward_passes_copy_each_layer_once_and_prefetch_across_the_end() -> None:
    engine = SimEngine()
    ring = Prefetcher(engine, _sources(5), lookahead=1)  # type: ignore[arg-type]
    _run(ring, engine, FORWARD[:5] * 4, "copies-first")
    assert (ring.stats.copies_in, ring.stats.reused) == (20 + 1, 0)  # +1: the next pass's 0


def test_training_order_keeps_the_turning_layers_instead_of_copying_them_again() -> None:
    engine = SimEngine()
    n, steps = 6, 3
    ring = Prefetcher(engine, _sources(n), lookahead=1, order=TRAIN)  # type: ignore[arg-type]
    _run(ring, engine, TRAIN * steps, "copies-first")
    # at each turn (forward -> backward, backward -> the next step's forward) the two
    # layers nearest the turn are still in the ring: used again without a copy
    turns = steps + (steps - 1)
    assert ring.stats.reused == 2 * turns
    assert ring.stats.copies_in + ring.stats.reused == 2 * n * steps


def test_invalidate_makes_the_next_use_copy_again_after_before_copy() -> None:
    engine = SimEngine()
    src = _sources(3)
    waited: list[int] = []
    ring = Prefetcher(engine, src, lookahead=1, before_copy=waited.append)  # type: ignore[arg-type]
    _run(ring, engine, [0, 1, 2], "copies-first")
    ring.invalidate(0)  # dropped from the buffer it was prefetched into
    src[0][:] = 9
    seen = _run(ring, engine, [0], "copies-last")
    assert seen[0][1] == {9}
    # copied: 0 1 2, then 0 (prefetched across the end), then 0 again after the
    # invalidation, each after before_copy
    assert waited == [0, 1, 2, 0, 0, 1]


def test_items_out_of_order_are_still_right() -> None:
    engine = SimEngine()
    ring = Prefetcher(engine, _sources(5), lookahead=2)  # type: ignore[arg-type]
    order = [3, 0, 0, 4, 1, 2, 2, 2, 0]
    seen = _run(ring, engine, order, "copies-last")
    assert [(i, v) for i, v, _ in seen] == [(i, {i + 1}) for i in order]


def test_holding_more_items_than_buffers_is_an_error_not_a_hang() -> None:
    engine = SimEngine()
    ring = Prefetcher(engine, _sources(4), lookahead=1)  # type: ignore[arg-type]
    ring.get(0, "compute")
    ring.get(1, "compute")
    with pytest.raises(OperationError, match="in use"):
        ring.get(2, "compute")


def test_an_item_asked_for_in_one_buffer_lands_there_whatever_the_ring_holds() -> None:
    src = _sources(4)
    ring = Prefetcher(HostEngine(), src, lookahead=1)
    for i in range(4):  # a pass that leaves item 3 in some buffer and 0 prefetched
        ring.get(i, None)
        ring.done(i, None)
    for item in (3, 1):
        other = 1 - (ring.buffer_of(3) or 0) if item == 3 else 0
        view = ring.get(item, None, slot_index=other)
        assert ring.buffer_of(item) == other and bytes(view.memory) == src[item].tobytes()
        with pytest.raises(OperationError, match=f"buffer {other} is in use"):
            ring.get(2, None, slot_index=other)
        ring.done(item, None)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"lookahead": -1}, "lookahead"),
        ({"lookahead": 1.5}, "lookahead"),
        ({"lookahead": 2, "slots": 2}, "at least 3"),
        ({"order": [0, 7]}, "order"),
        ({"order": []}, "order"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidRequestError, match=words):
        Prefetcher(HostEngine(), _sources(3), **kwargs)


def test_bad_items_are_refused() -> None:
    ring = Prefetcher(HostEngine(), _sources(3))
    for bad in (3, -1, "0", True):
        with pytest.raises(InvalidRequestError, match="item"):
            ring.get(bad, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="not in use"):
        ring.done(1, None)
    with pytest.raises(InvalidRequestError, match="nothing to stream"):
        Prefetcher(HostEngine(), [])


def test_the_host_engine_streams_bytes_into_host_buffers() -> None:
    src = _sources(3)
    ring = Prefetcher(HostEngine(), src, lookahead=1)
    for _ in range(2):
        for i in range(3):
            view = ring.get(i, None)
            assert bytes(view.memory) == src[i].tobytes() and view.nbytes == src[i].nbytes
            ring.done(i, None)


def test_the_host_engine_refuses_copies_past_a_buffer_or_of_unequal_sizes() -> None:
    engine = HostEngine()
    buffer = engine.buffer(64)
    with pytest.raises(InvalidRequestError, match="of a buffer of 64 bytes"):
        engine.slot_view(buffer, 65)
    view = engine.slot_view(buffer, 32)
    with pytest.raises(InvalidRequestError, match="a copy of 16 bytes into 32 bytes"):
        engine.copy_in(view, np.zeros(4, np.float32))
    engine.copy_in(view, np.arange(8, dtype=np.float32))
    assert bytes(view.memory) == np.arange(8, dtype=np.float32).tobytes()


@pytest.mark.parametrize("layers", [1, 2, 3, 6])
@pytest.mark.parametrize("backward", [False, True])
def test_the_offload_bound_counts_the_copies_the_ring_makes(layers: int, backward: bool) -> None:
    from pycxl.measure.offload import stream_copies

    order = list(range(layers)) + (list(range(layers))[::-1] if backward else [])
    engine = SimEngine()
    ring = Prefetcher(engine, _sources(layers), lookahead=1, order=order)  # type: ignore[arg-type]
    _run(ring, engine, order * 2, "copies-first")  # the first steps fill the ring
    before = ring.stats.copies_in
    _run(ring, engine, order * 3, "copies-first")
    assert (ring.stats.copies_in - before) == 3 * stream_copies(layers, backward)


def test_offload_results_are_built_whole_from_what_a_run_measures() -> None:
    """The result a run assembles (no GPU here: its figures given) has every field, and
    the bound follows link_time: one way forward, both ways at once backward."""
    from pycxl.measure.offload import _result, link_time
    from pycxl.measure.targets import Pair, Target

    lb = 128 << 20
    fwd = link_time(16 * lb, 0, 50e9, 50e9, 90e9)
    assert fwd == pytest.approx(16 * lb / 50e9)
    back = link_time(28 * lb, 16 * lb, 50e9, 50e9, 90e9)
    assert back == pytest.approx(14 * lb / 50e9 + 30 * lb / 90e9)
    figures = dict(compute_s=0.01, pinned_h2d_bytes_per_s=50e9, pinned_d2h_bytes_per_s=50e9,
                   pinned_bidir_bytes_per_s=90e9, bound_s=back)  # fmt: skip
    common = dict(initiator="gpu0", gpu="GPU", layers=16, width=8192, tokens=1024,
                  layer_bytes=lb, backward=True, samples=3)  # fmt: skip
    dram0 = Target("dram0", "node", node=0, tier="dram")
    p = Pair(dram0, dram0, cpus=(0,), free=1 << 40)
    r = _result("pycxl", [0.09, 0.08, 0.1], p, figures, common, bytes_=(28 * lb, 16 * lb),
                pages=(10, 10), hidden=0.1, lookahead=1)  # fmt: skip
    assert r.step_s == 0.09 and r.vs_bound == pytest.approx(0.09 / back)
    assert bench_result_json(r)["pinned_bidir_bytes_per_s"] == 90e9 and r.target == "dram0"
    hbm = _result("hbm", [0.01], None, figures, common, bytes_=(0, 0))
    assert hbm.target == "gpu0" and hbm.node is None and hbm.link_bytes_per_s is None
