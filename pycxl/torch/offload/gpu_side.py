"""The GPU side of a model offload's update: the blocks the plan gives the GPU, their
state (and, streamed, their gradients) copied from the tier in pieces through three
device buffers, updated there by PyTorch's fused CUDA Adam and copied back (with the new
weights, streamed), the copies of the next and the last piece running beside the update
(the link carries both directions). The host does not wait; the side's own events time
it."""

from __future__ import annotations

from typing import Any

from .._import import import_torch
from .adam import AdamSettings, AdamSteps, gpu_adam_step
from .layout import Block, ParamSlot, chunks_of

SLOTS = 3  # copy in, update, copy out
CHUNK_ELEMENTS = 1 << 23  # a piece: 8 Mi elements, 160 MiB of buffers each


class GpuSide:
    """``engine``: the offload's engine (its context); the side has copy streams of its
    own, so the next forward pass's copies (and the CPU side's weights) do not queue
    behind the whole update. ``chunk``: elements a piece; ``steps``: the offload's step
    counts."""

    def __init__(
        self, engine: Any, device: Any, chunk: int, low: Any, streamed: bool, steps: AdamSteps
    ) -> None:
        from ...gpu.cuda_engine import CudaEngine
        from ...gpu.streams import Event

        torch = import_torch()
        self.device = device
        self.chunk = chunk
        self.streamed = streamed
        self.steps = steps
        self._low = low  # the weights' and gradients' dtype
        self.engine = CudaEngine(engine.ctx)
        self.update_stream = torch.cuda.Stream(device)
        self._events = {
            name: [engine.event() for _ in range(SLOTS)] for name in ("loaded", "updated", "free")
        }
        # the side's parameters this step, by whether begun in the backward pass (each
        # kind timed by a pair of events, from its first block's copy in to its last out)
        self._timing = {early: (Event(), Event()) for early in (False, True)}
        self.timed: dict[bool, int] = {}
        self._next_slot = 0  # the next device buffer, across the side's calls in a step
        self._slots: list[tuple[Any, Any]] = []
        self._hbm_grads: Any = None  # a piece of fp32 gradients for blocks whose state is in HBM

    def _group_and_step(self, p: ParamSlot) -> tuple[int, int]:
        """What one piece's update shares: its param group and step number."""
        return p.group, self.steps.of(p.param)

    def buffers(self) -> list[tuple[Any, Any]]:
        """The device buffers, made when the side first has work (a plan that puts every
        block on the CPU takes no GPU memory for them)."""
        if not self._slots:
            torch = import_torch()
            self._slots = [
                (torch.empty(4 * self.chunk, dtype=torch.float32, device=self.device),
                 torch.empty(2 * self.chunk, dtype=self._low, device=self.device))
                for _ in range(SLOTS)
            ]  # fmt: skip
            # their memory may be what the compute stream freed and has not finished with
            eng = self.engine
            made = eng.event()
            eng.record(made, torch.cuda.current_stream(self.device))
            for stream in (eng.copy_in_stream, eng.copy_out_stream, self.update_stream):
                eng.wait(stream, made)
        return self._slots

    def free(self) -> None:
        """The device buffers given back (made again if the side has work)."""
        self._slots = []
        self._hbm_grads = None

    def link_bytes_per_s(self, B: Block) -> float:
        """Bytes per second each way with a piece of ``B``'s state going in and out at
        once (what goes back is what is there), the best of three."""
        from ...gpu.streams import Event

        eng = self.engine
        host = B.state[: 3 * self.chunk]
        into, out_of = (s[0][: host.numel()] for s in self.buffers()[:2])
        eng.copy_in(out_of, host)
        start, end_in, end_out = Event(), Event(), Event()
        best = float("inf")
        for _ in range(3):
            start.record(borrowed(eng.copy_in_stream))
            eng.wait(eng.copy_out_stream, start)
            eng.copy_in(into, host)
            eng.copy_out(host, out_of)
            end_in.record(borrowed(eng.copy_in_stream))
            end_out.record(borrowed(eng.copy_out_stream))
            end_in.synchronize()
            end_out.synchronize()
            best = min(best, max(end_in.ms_since(start), end_out.ms_since(start)) / 1e3)
        import_torch().cuda.synchronize(self.device)
        return float(host.numel() * 4) / best

    def update(
        self,
        blocks: list[Block],
        live: dict[int, list[ParamSlot]],
        produced: Any,
        settings: list[AdamSettings],
        *,
        early: bool = False,
    ) -> None:
        """Enqueue ``blocks`` piece by piece, once ``produced`` (their gradients) is
        recorded; each block's ``updated`` event is where the next forward pass finds its
        new weights. ``early``: one block begun in the backward pass (timed apart from
        those begun at step(), from the first such block to the last)."""
        torch = import_torch()
        eng, ev, upd, streamed = self.engine, self._events, self.update_stream, self.streamed
        eng.wait(upd, produced)
        step_of: dict[int, Any] = {}  # step number -> its tensor, made on the update stream
        start, end = self._timing[early]
        if early not in self.timed:
            start.record(borrowed(eng.copy_in_stream))
        self.timed[early] = self.timed.get(early, 0) + sum(B.numel for B in blocks)
        slots = self.buffers()
        c = self.chunk
        j = self._next_slot  # an early block's call follows the last one's buffers
        for B in blocks:
            params = live[B.index]
            for a, b, (g, n_step) in chunks_of(B, c, params, key=self._group_and_step):
                s = j % SLOTS
                j += 1
                n = b - a
                host = [B.part_span(B.state, k, a, b) for k in range(3)]  # master, moments
                f32, lows = slots[s]
                master, m, v, g32 = (f32[k * c : k * c + n] for k in range(4))
                gin, wout = lows[:n], lows[c : c + n]
                eng.wait(eng.copy_in_stream, ev["free"][s])
                for t, h in zip((master, m, v), host, strict=True):
                    eng.copy_in(t, h)
                if streamed:
                    eng.copy_in(gin, B.grads[a:b])
                eng.record(ev["loaded"][s], eng.copy_in_stream)
                eng.wait(upd, ev["loaded"][s])
                with torch.cuda.stream(upd):
                    if n_step not in step_of:
                        step_of[n_step] = torch.full((), float(n_step), device=self.device)
                    if streamed:
                        g32.copy_(gin)
                    else:
                        _gather_grads(g32, a, b, params, upd)
                    _step_piece(master, m, v, g32, step_of[n_step], settings[g])
                    if streamed:
                        wout.copy_(master)
                    else:
                        _scatter_weights(master, a, b, params)
                eng.record(ev["updated"][s], upd)
                eng.wait(eng.copy_out_stream, ev["updated"][s])
                for t, h in zip((master, m, v), host, strict=True):
                    eng.copy_out(h, t)
                if streamed:
                    eng.copy_out(B.weights[a:b], wout)
                eng.record(ev["free"][s], eng.copy_out_stream)
            eng.record(B.flight.updated, eng.copy_out_stream if streamed else upd)
        end.record(borrowed(eng.copy_out_stream))
        self._next_slot = j % SLOTS

    def update_in_hbm(
        self,
        blocks: list[Block],
        live: dict[int, list[ParamSlot]],
        produced: Any,
        settings: list[AdamSettings],
    ) -> None:
        """Enqueue ``blocks`` whose state lives in HBM (resident weights): updated in
        place piece by piece on the update stream, once ``produced`` is recorded, nothing
        over the link and no buffer but one fp32 piece of gradients; not timed (the
        split is of the blocks on the tier)."""
        torch = import_torch()
        upd = self.update_stream
        self.engine.wait(upd, produced)
        if self._hbm_grads is None:
            self._hbm_grads = torch.empty(self.chunk, dtype=torch.float32, device=self.device)
        step_of: dict[int, Any] = {}
        with torch.cuda.stream(upd):
            for B in blocks:
                params = live[B.index]
                for a, b, (g, n_step) in chunks_of(B, self.chunk, params, key=self._group_and_step):
                    if n_step not in step_of:
                        step_of[n_step] = torch.full((), float(n_step), device=self.device)
                    master, m, v = (B.part_span(B.state, k, a, b) for k in range(3))
                    g32 = self._hbm_grads[: b - a]
                    _gather_grads(g32, a, b, params, upd)
                    _step_piece(master, m, v, g32, step_of[n_step], settings[g])
                    _scatter_weights(master, a, b, params)
                self.engine.record(B.flight.updated, upd)

    def take_timed(self) -> dict[bool, int]:
        """The parameters the side updated in the last step, by whether begun in the
        backward pass; the record cleared for the next."""
        timed, self.timed = self.timed, {}
        return timed

    def seconds(self, timed: dict[bool, int], at_step: Any) -> tuple[float, float]:
        """The side's seconds for all its blocks of the last step (``timed``), at the
        rate of those begun at step() (those begun in the backward pass wait for
        gradients between blocks; where it began them all there, at theirs), and its
        seconds after ``at_step`` (an event at step() on the device)."""
        if not timed:
            return 0.0, 0.0
        at_step.synchronize()
        seconds, after = {}, 0.0
        for early in timed:
            start, end = self._timing[early]
            end.synchronize()
            seconds[early] = end.ms_since(start) / 1e3
            after = max(after, end.ms_since(at_step) / 1e3)
        basis = False not in timed  # at step() where there were any
        return sum(timed.values()) * seconds[basis] / timed[basis], after


def _step_piece(master: Any, m: Any, v: Any, g32: Any, step: Any, s: AdamSettings) -> None:
    """One piece's Adam step on the device, its fp32 gradient first scaled by a clip's
    coefficient where one was left."""
    if s.grad_scale != 1.0:
        g32.mul_(s.grad_scale)
    gpu_adam_step([master], [g32], [m], [v], step, s)


def grad_of(p: ParamSlot) -> Any:
    """``p``'s gradient as one contiguous row."""
    g = p.param.grad
    if not g.is_contiguous():
        g = g.contiguous()
    return g.view(-1)


def borrowed(stream: Any) -> Any:
    """A torch stream as pycxl's Stream, for its events."""
    from ...gpu.streams import Stream

    return Stream.borrow(stream)


def _span_in(a: int, b: int, p: ParamSlot) -> tuple[int, int]:
    """The part of ``p`` in elements [a, b) of the block's layout, as (start, end) in
    the layout (empty where there is none)."""
    return max(a, p.offset), min(b, p.offset + p.numel)


def _gather_grads(g32: Any, a: int, b: int, params: list[ParamSlot], stream: Any) -> None:
    """Resident: the gradients of [a, b) into the fp32 piece ``g32`` (gaps zero); each
    gradient's memory is kept for ``stream``, which reads it."""
    if sum(max(0, hi - lo) for lo, hi in (_span_in(a, b, p) for p in params)) < b - a:
        g32.zero_()
    for p in params:
        lo, hi = _span_in(a, b, p)
        if lo >= hi:
            continue
        g = grad_of(p)
        g32[lo - a : hi - a].copy_(g[lo - p.offset : hi - p.offset])
        g.record_stream(stream)
        p.param.grad.record_stream(stream)


def _scatter_weights(master: Any, a: int, b: int, params: list[ParamSlot]) -> None:
    """Resident: the new weights of [a, b) from the fp32 piece into the parameters."""
    for p in params:
        lo, hi = _span_in(a, b, p)
        if lo < hi:
            p.param.data.view(-1)[lo - p.offset : hi - p.offset].copy_(master[lo - a : hi - a])
