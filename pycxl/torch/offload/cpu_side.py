"""The CPU side of a model offload's update: the fused CPU step of native/adam.c on the
blocks the plan gives the CPU, one block at a time on a worker thread (with a GPU) so
the host is free meanwhile. It reads each block's gradients on the tier (resident on a
GPU: once they have landed there), updates master and moments in one pass and writes the
weights where the next forward pass reads them (resident on a GPU: copied in). Blocks
begun in the backward pass queue for the worker: the last block first while gradients
arrive, the first block first after step() (the next forward pass needs it first)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .adam import AdamSettings, AdamSteps, CpuAdam
from .gpu_side import grad_of
from .layout import Block, ParamSlot, piece


class CpuSide:
    """``engine``: the offload's (its copies and events); ``cpus``: the threads' CPUs;
    ``resident_gpu``: the weights live on a GPU (gradients copied out, weights in);
    ``steps``: the offload's step counts."""

    def __init__(
        self, engine: Any, cpus: Sequence[int], steps: AdamSteps, *, on_gpu: bool, streamed: bool
    ) -> None:
        self.engine = engine
        self.steps = steps
        self.on_gpu = on_gpu
        self.resident_gpu = on_gpu and not streamed
        self.adam = CpuAdam(cpus)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="pycxl-cpu-adam")
        # the first block's start and the last block's end this step: the side's rate
        # counts the waits between (for gradients to land behind the link's other traffic;
        # in a backward pass slower than the CPU side, for them to be made, too)
        self.first = self.end = 0.0
        self.done: Any = None  # its last weights copied in (a timed event, on a GPU)
        if on_gpu:
            from ...gpu.streams import Event

            self.done = Event()
        self._waiting: list[tuple[Block, list[ParamSlot], list[AdamSettings], Future[None]]] = []
        self._waiting_lock = threading.Lock()
        self._backward_order = True

    def step(
        self, B: Block, p: ParamSlot, grad: Any, step: int, settings: AdamSettings, weight: Any
    ) -> None:
        """One parameter's step over its state on the tier; ``weight``: where its new
        weights go (none where the master is the weight)."""
        state = (B.part(B.state, 0, p), B.part(B.state, 1, p), B.part(B.state, 2, p))
        out = None if weight.data_ptr() == state[0].data_ptr() else weight
        self.adam.step(state, grad, out, step, settings)

    def params_per_s(self, B: Block) -> float:
        """Parameters per second on ``B`` with a zero learning rate and zero gradients
        (the state is zero at set-up and stays so; the weights written are the ones
        there), the better of two (the first warms caches and page tables)."""
        settings = AdamSettings(0.0, (0.9, 0.999), 1e-8, 0.0, True, False)
        grads = B.grads.zero_()
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            for p in B.params:
                self.step(B, p, piece(grads, p), 1, settings, piece(B.weights, p))
            best = min(best, time.perf_counter() - t0)
        return B.numel / best

    def block(self, B: Block, params: list[ParamSlot], settings: list[AdamSettings]) -> None:
        """One block's step (on the worker thread, with a GPU): its gradients from the
        tier (resident: once landed), the weights written where the next forward pass
        reads them."""
        eng = self.engine
        if self.resident_gpu:
            eng.synchronize(B.flight.landed)
            B.flight.kept = []  # landed: the memory may go
        elif self.on_gpu and B.flight.landed is not None:
            eng.synchronize(B.flight.landed)  # streamed: home (at step(), long since)
        began = time.perf_counter()  # one thread runs the blocks: no other writes the clock
        for p in params:
            if B.grads is not None:  # the gradients on the tier
                grad, weight = piece(B.grads, p), piece(B.weights, p)
            else:  # the CPU, resident: the parameter's own
                grad, weight = grad_of(p), p.param.data.view(-1)
            self.step(B, p, grad, self.steps.of(p.param), settings[p.group], weight)
            if self.resident_gpu:
                eng.copy_in(p.param.data, weight)
        if self.resident_gpu:
            eng.record(B.flight.updated, eng.copy_in_stream)
            eng.record(self.done, eng.copy_in_stream)
        self.first = self.first or began
        self.end = time.perf_counter()

    def grads_out(self, blocks: list[Block], live: dict[int, list[ParamSlot]], stream: Any) -> None:
        """Resident on a GPU: the blocks' gradients to the tier on the copy-out stream,
        once ``stream`` has made them (contiguous copies included); each block's step
        waits for its own, and the gradients' memory is kept until then."""
        eng = self.engine
        kept = {B.index: [grad_of(p) for p in live[B.index]] for B in blocks}
        produced = eng.event()
        eng.record(produced, stream)  # after the contiguous copies
        eng.wait(eng.copy_out_stream, produced)
        for B in blocks:
            for p, g in zip(live[B.index], kept[B.index], strict=True):
                eng.copy_out(piece(B.grads, p), g)
            eng.record(B.flight.landed, eng.copy_out_stream)
            B.flight.kept = kept[B.index]

    def submit(self, B: Block, params: list[ParamSlot], settings: list[AdamSettings]) -> None:
        """``B``'s step on the worker, at step(); ``B.flight.cpu_update`` is its future."""
        B.flight.cpu_update = self._worker.submit(self.block, B, params, settings)

    def submit_early(self, B: Block, params: list[ParamSlot], settings: list[AdamSettings]) -> None:
        """``B``'s step begun in the backward pass: at once without a GPU, else queued
        for the worker (which takes the last block first while gradients arrive)."""
        if not self.on_gpu:
            self.block(B, params, settings)
            return
        done: Future[None] = Future()
        item = (B, params, settings, done)
        with self._waiting_lock:
            self._backward_order = True
            self._waiting.append(item)
        try:
            self._worker.submit(self._next_waiting)
        except BaseException as e:  # the worker is gone: nothing will take it
            with self._waiting_lock:
                self._waiting.remove(item)
            done.set_exception(e)
            raise
        B.flight.cpu_update = done

    def forward_order(self) -> None:
        """Every gradient is in (step() was called): what waits goes in the next
        forward pass's order."""
        with self._waiting_lock:
            self._backward_order = False

    def _next_waiting(self) -> None:
        """The worker: one step begun in the backward pass (each call runs one)."""
        with self._waiting_lock:
            pick = max if self._backward_order else min
            item = pick(self._waiting, key=lambda w: w[0].index)
            self._waiting.remove(item)
        B, params, settings, done = item
        try:
            self.block(B, params, settings)
        except BaseException as e:  # raised where the block's update is waited for
            done.set_exception(e)
        else:
            done.set_result(None)

    def close(self) -> None:
        """The worker stopped (after what it has) and the step's threads too."""
        self._worker.shutdown(wait=True)
        self.adam.close()
