"""The ferry: blocks whose weights live on a tier and visit the device only while they
run, with their gradients sent home. The one weight-streaming mechanism: the weights'
half of ``offload_model(..., weights="stream")`` and of ``offload_layers(...,
weights="stream")``.

Each block's parameters stay ordinary ``torch.nn.Parameter`` objects whose data is host
memory on the tier (their home), except while the block runs: a forward pre-hook binds
them to a ring buffer on the device that holds the block (``Prefetcher``: the next
block's copy runs behind this one's compute), and the block is let go after its forward
pass. In training a hook on the block's output gradient binds it again before its
backward pass; a forward pass run again inside the backward pass (activation
checkpointing) finds it bound, and the ring sees each block once per pass whatever the
checkpointing does. A block held for its backward pass is let go when the block before
it is taken, or when the backward pass ends.

Gradients come home. Just before a gradient is accumulated into a parameter whose
``.grad`` is its home gradient (an earlier micro-batch's), that gradient is set aside,
so autograd makes the new one on the device; once a block's gradients are all there
they are copied home, or, where an earlier micro-batch's are home, copied beside them
and added on the CPU. When the backward pass ends every copy has landed and each
parameter's ``.grad`` is its home gradient, a CPU tensor: gradient accumulation,
clipping by global norm, GradScaler and logging see ordinary gradients, and the GPU
never holds more than a few blocks' weights and gradients (a backward pass that runs
ahead of the link waits for the copies home of all but the last LANDING_MAX blocks).
Where each backward pass's gradients are handed to an update that consumes them
(``accumulate=False``: offload_layers' optimizer), ``.grad`` stays None instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ...gpu.engine import Engine
from ...gpu.prefetch import Prefetcher
from .._import import import_torch
from .adam import CpuAdam
from .grad_norms import GradNorms
from .layout import Block, ParamSlot, piece

LANDING_MAX = 2  # blocks whose gradients may be on their way home at once


def ring_tensor(view: Any, device: Any) -> Any:
    """A ring buffer the Prefetcher handed out (a DeviceView, or a HostView on the CPU)
    as a flat uint8 tensor on ``device``, without a copy."""
    torch = import_torch()
    if torch.device(device).type == "cuda":
        return torch.as_tensor(view, device=device)
    return torch.frombuffer(view.memory, dtype=torch.uint8)


class AtBackwardEnd:
    """``callback`` called once when the backward pass running now ends: ``ask()`` from
    its hooks (once per pass; a reentrant checkpoint's inner pass is a pass of its own),
    ``forget()`` where the callback runs by other means (a pass that raised)."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._task = -2  # the backward pass whose end is awaited

    def ask(self) -> None:
        """Call back when this backward pass ends (asked again in it: once)."""
        torch = import_torch()
        task = torch._C._current_graph_task_id()
        if task != self._task:
            self._task = task
            torch.autograd.Variable._execution_engine.queue_callback(self._ended)

    def forget(self) -> None:
        """No end awaited now."""
        self._task = -2

    def _ended(self) -> None:
        self._task = -2
        self._callback()


def in_backward() -> bool:
    """Whether this thread is running a backward pass (autograd's engine)."""
    return bool(import_torch()._C._current_graph_task_id() != -1)


class WeightFerry:
    """``blocks`` (each with ``weights`` and ``grads`` in host memory on the tier,
    pinned for a GPU) streamed to ``device`` through a ring of ``lookahead + 1``
    buffers; ``before_copy(position)`` runs on the host before each copy of a block
    (to wait for its update); ``host_alloc(block)`` gives host memory like the block's
    ``grads`` (for a later micro-batch's gradients); ``on_home(block, adding, sent)``
    runs each time gradients of a block are on their way home: ``sent``, the positions
    (in ``block.params``) of the parameters whose gradients went (all of the block's
    once they have all arrived, or those that had when the backward pass left the
    block); ``adding``: onto an earlier micro-batch's (``adder()`` makes the threads that
    add them, at the first, and the ferry closes it; without one, torch).
    ``accumulate``: gradients add up across backward passes in ``.grad`` (False:
    ``on_home`` consumes each pass's;
    ``.grad`` stays None). Takes the parameters home at once. A parameter changed in
    place at home (an optimizer of the user's, ``copy_``) is copied to the device again
    when its block next runs."""

    def __init__(
        self,
        blocks: Sequence[Block],
        engine: Engine,
        device: Any,
        *,
        lookahead: int,
        before_copy: Callable[[int], None],
        host_alloc: Callable[[Block], Any],
        on_home: Callable[[Block, bool, list[int]], None] | None = None,
        accumulate: bool = True,
        norms: GradNorms | None = None,
        adder: Callable[[], CpuAdam] | None = None,
    ) -> None:
        torch = import_torch()
        self.norms = norms  # where given, the gradients' norms are taken as they leave
        # where given, later micro-batches' gradients are added home by the threads it
        # makes at the first such add (a loop without accumulation makes none), the sums'
        # norms taken in the same pass (else by torch, and their norms not known)
        self._make_adder = adder
        self._cpu_adder: CpuAdam | None = None
        self.blocks = list(blocks)
        self.engine = engine
        self._host_alloc = host_alloc
        self._on_home = on_home
        self._accumulate = accumulate
        self._trains = any(B.params for B in self.blocks)  # some block takes gradients
        self.bytes_home = 0  # gradients copied home so far
        self.device = torch.device(device)
        self._on_gpu = self.device.type == "cuda"
        self._position = {id(B): k for k, B in enumerate(self.blocks)}
        self._home = [self._views(B, B.weights, B.everything) for B in self.blocks]
        self._home_grads = [self._views(B, B.grads, B.params) for B in self.blocks]
        self._go_home()
        self.ring = Prefetcher(
            engine, [B.weights for B in self.blocks], lookahead=lookahead, before_copy=before_copy
        )
        self._bound: dict[tuple[int, int], list[Any]] = {}  # (slot, block) -> parameter views
        self._held: set[int] = set()  # positions bound to a ring buffer now
        self._stale: set[int] = set()  # held while their home weights changed: dropped after
        # each let-go block's parameters' versions then: changed in place since, its
        # device copy is stale
        self._versions: dict[int, list[int]] = {}
        self._backward_held: list[Block] = []
        self._training_order = False
        self._arrived = [0] * len(self.blocks)  # gradients accumulated this backward pass
        self._set_aside: set[int] = set()  # ids of parameters whose home gradient waits
        self._landing: list[Block] = []  # copies home in flight
        self._landed_params: list[tuple[int, int]] = []  # (block, parameter) positions
        # the copies home run on the engine's stream: the allocator must not reuse a
        # device gradient's memory before its copy has run
        self._copy_out: Any = None
        if self._on_gpu:
            self._copy_out = torch.cuda.ExternalStream(
                engine.copy_out_stream.address, device=self.device
            )
        self._adds: list[Future[None]] = []
        self._adder = ThreadPoolExecutor(1, thread_name_prefix="pycxl-grad-add")
        self._end = AtBackwardEnd(self._backward_done)
        self._hooks: list[Any] = []
        self._install()

    # --- set-up ----------------------------------------------------------------------
    @staticmethod
    def _views(B: Block, flat: Any, params: list[ParamSlot]) -> list[Any]:
        return [piece(flat, p).view(p.shape) for p in params]

    def _go_home(self) -> None:
        """Copy each parameter into its home on the tier and point it there."""
        torch = import_torch()
        with torch.no_grad():
            for B, home in zip(self.blocks, self._home, strict=True):
                for p, view in zip(B.everything, home, strict=True):
                    if p.param.data_ptr() != view.data_ptr():  # not made there already
                        view.copy_(p.param.detach())
                        p.param.data = view
                    p.param.grad = None

    def _install(self) -> None:
        torch = import_torch()
        eager = torch.compiler.disable  # a compiled model calls the hooks as they are
        for B in self.blocks:
            m = B.module
            before = eager(functools.partial(self._before_forward, B))
            after = eager(functools.partial(self._after_forward, B))
            self._hooks += [m.register_forward_pre_hook(before), m.register_forward_hook(after)]
            for j, p in enumerate(B.params):
                self._hooks.append(p.param.register_hook(
                    functools.partial(self._before_accumulate, B, j)))  # fmt: skip
                self._hooks.append(p.param.register_post_accumulate_grad_hook(
                    functools.partial(self._accumulated, B)))  # fmt: skip

    # --- binding -----------------------------------------------------------------------
    def _stream(self) -> Any:
        torch = import_torch()
        return torch.cuda.current_stream(self.device) if self._on_gpu else None

    def _take(self, B: Block, backward: bool, slot: int | None = None) -> None:
        """Bind ``B``'s parameters to a ring buffer holding it: for its backward pass,
        ``slot``, the buffer its forward pass used (autograd saved views of that memory
        then, a Linear's weight.t(), and reads them now)."""
        k = self._position[id(B)]
        if k in self._held:
            if slot is None or self.ring.buffer_of(k) == slot:
                return
            self._let_go(B)  # held in another buffer than this graph's views
            if B in self._backward_held:
                self._backward_held.remove(B)
        if backward:
            self._let_go_backward()  # the blocks after it are done
        seen = self._versions.pop(k, None)
        if seen is not None and seen != [p.param._version for p in B.everything]:
            self.ring.invalidate(k)  # changed at home since it was let go
        view = self.ring.get(k, self._stream(), slot_index=slot)
        key = (view.slot, k)
        views = self._bound.get(key)
        if views is None:
            flat = ring_tensor(view, self.device).view(B.dtype)
            views = self._bound[key] = self._views(B, flat, B.everything)
        for p, v in zip(B.everything, views, strict=True):
            p.param.data = v
        self._held.add(k)
        if backward:
            self._backward_held.append(B)

    def _let_go(self, B: Block) -> None:
        k = self._position[id(B)]
        if k not in self._held:
            return
        self.ring.done(k, self._stream())
        for p, home in zip(B.everything, self._home[k], strict=True):
            p.param.data = home
        self._versions[k] = [p.param._version for p in B.everything]
        self._held.discard(k)
        if k in self._stale:
            self._stale.discard(k)
            self.ring.invalidate(k)

    def _let_go_backward(self) -> None:
        """The blocks held for their backward pass are done: their gradients that have
        arrived go home now (a parameter that takes none this pass does not hold the
        others on the device), and their buffers go back to the ring."""
        while self._backward_held:
            B = self._backward_held.pop()
            if self._arrived[self._position[id(B)]]:
                self._home_and_tell(B)
            self._let_go(B)

    # --- hooks -------------------------------------------------------------------------
    def _before_forward(self, B: Block, module: Any, args: Any) -> None:
        backward = in_backward()
        if not backward and B is self.blocks[0]:
            self._forget_a_broken_pass()
            torch = import_torch()
            # training: gradients will come (also when a reentrant checkpoint runs this
            # pass without them and again later with them)
            training = self._trains and (
                bool(torch.is_grad_enabled())
                or any(getattr(a, "requires_grad", False) for a in args)
            )
            if training != self._training_order:
                n = len(self.blocks)
                self.ring.set_order([*range(n), *reversed(range(n))] if training else range(n))
                self._training_order = training
        self._take(B, backward)

    def _after_forward(self, B: Block, module: Any, args: Any, output: Any) -> None:
        if in_backward():
            return  # run again for its backward pass (checkpointing): it stays bound
        slot = self.ring.buffer_of(self._position[id(B)])
        self._let_go(B)
        outputs = output if isinstance(output, tuple | list) else (output,)
        for t in outputs:
            if getattr(t, "requires_grad", False):
                # every backward pass through this output takes the block first, into
                # the buffer this forward pass used
                t.register_hook(functools.partial(self._before_backward, B, slot))

    def _before_backward(self, B: Block, slot: int | None, grad: Any) -> None:
        self._take(B, backward=True, slot=slot)
        self._end.ask()

    def _before_accumulate(self, B: Block, j: int, grad: Any) -> None:
        k = self._position[id(B)]
        p = B.params[j]
        if p.param.grad is not None and p.param.grad is self._home_grads[k][j]:
            self._set_aside.add(id(p.param))  # an earlier micro-batch's: added to later
            p.param.grad = None
        self._end.ask()

    def _accumulated(self, B: Block, param: Any) -> None:
        k = self._position[id(B)]
        self._arrived[k] += 1
        if self._arrived[k] == len(B.params):
            self._home_and_tell(B)

    def _forget_a_broken_pass(self) -> None:
        """A backward pass that raised never reached its end: what it left is dropped
        before the next pass begins (its gradients are lost, as PyTorch's would be)."""
        if self._backward_held or any(self._arrived) or self._landing:
            self._backward_done()

    # --- gradients home ----------------------------------------------------------------
    def _home_and_tell(self, B: Block) -> None:
        """The block's gradients that arrived sent home, and ``on_home`` told."""
        adding, sent = self._send_home(B)
        if sent and self._on_home is not None:
            self._on_home(B, adding, sent)

    def _send_home(self, B: Block) -> tuple[bool, list[int]]:
        """Copy the block's gradients that arrived home: whether they are added onto an
        earlier micro-batch's, and which parameters' went."""
        k = self._position[id(B)]
        self._arrived[k] = 0
        eng = self.engine
        home = self._home_grads[k]
        arrived = [
            j for j, p in enumerate(B.params)
            if p.param.grad is not None and p.param.grad is not home[j]
        ]  # fmt: skip
        if not arrived:
            return False, []
        grads = []
        for j in arrived:
            g = B.params[j].param.grad
            grads.append(g if g.is_contiguous() else g.contiguous())
        produced = eng.event()
        eng.record(produced, self._stream())  # after the contiguous copies, if any
        eng.wait(eng.copy_out_stream, produced)
        adding = any(id(B.params[j].param) in self._set_aside for j in arrived)
        if self.norms is not None:  # on the stream that made them, before they go
            self.norms.sent([B.params[j].param for j in arrived], grads,
                            [self._home_grads[k][j] for j in arrived], adding)  # fmt: skip
        if adding and B.incoming is None:
            B.incoming = self._host_alloc(B)
        target = B.incoming if adding else B.grads
        size = B.dtype.itemsize
        for j, g in zip(arrived, grads, strict=True):
            p = B.params[j]
            eng.copy_out(piece(target, p), g)
            self.bytes_home += p.numel * size
            if self._copy_out is not None:
                g.record_stream(self._copy_out)
            p.param.grad = None
        if B.flight.landed is None:
            B.flight.landed = eng.event()
        eng.record(B.flight.landed, eng.copy_out_stream)
        self._landing.append(B)
        if len(self._landing) > LANDING_MAX:
            # a backward pass faster than the link would leave every block's gradients
            # on the device, waiting for their copies: hold it until an older one landed
            eng.synchronize(self._landing[-LANDING_MAX - 1].flight.landed)
        self._landed_params += [(k, j) for j in arrived]
        if adding:
            self._adds.append(self._adder.submit(self._add, B, arrived))
        return adding, arrived

    def _add(self, B: Block, arrived: list[int]) -> None:
        """Once landed: each parameter's new gradient added to the one set aside, or
        taking its place where none was (adder thread)."""
        torch = import_torch()
        self.engine.synchronize(B.flight.landed)
        k = self._position[id(B)]
        with torch.no_grad():
            for j in arrived:
                p = B.params[j]
                home, new = piece(B.grads, p), piece(B.incoming, p)
                adding = id(p.param) in self._set_aside
                if self._make_adder is not None:
                    if self._cpu_adder is None:  # only ever on the one adder thread
                        self._cpu_adder = self._make_adder()
                    sumsq = self._cpu_adder.accumulate(home, new, adding)
                    if self.norms is not None:
                        self.norms.summed(p.param, sumsq, self._home_grads[k][j])
                elif adding:
                    home.add_(new)
                else:
                    home.copy_(new)

    def _backward_done(self) -> None:
        """The end of a backward pass: blocks let go, every gradient home and landed,
        each parameter's ``.grad`` its home gradient."""
        self._end.forget()
        self._let_go_backward()
        for B, n in zip(self.blocks, self._arrived, strict=True):
            if n:  # some of its parameters took no gradient this time
                self._home_and_tell(B)
        landing, self._landing = self._landing, []
        for B in landing:
            self.engine.synchronize(B.flight.landed)
        adds, self._adds = self._adds, []
        for f in adds:
            f.result()
        if adds and self._make_adder is None and self.norms is not None:
            self.norms.lost()  # sums made by torch: their norms are not known
        if self._accumulate:
            for k, j in self._landed_params:
                self.blocks[k].params[j].param.grad = self._home_grads[k][j]
        self._landed_params.clear()
        # set aside, and no new one came (torch.autograd.grad runs the hooks, accumulates
        # nothing): the earlier gradient is the parameter's again
        for k, B in enumerate(self.blocks):
            for j, p in enumerate(B.params):
                if id(p.param) in self._set_aside and p.param.grad is None:
                    p.param.grad = self._home_grads[k][j]
        self._set_aside.clear()
        if self.norms is not None:
            self.norms.pass_ended()

    # --- the update's side ---------------------------------------------------------------
    def home_grads(self, B: Block) -> list[Any]:
        """The block's home gradients, one view per trainable parameter: each
        parameter's ``.grad`` once a backward pass has ended."""
        return self._home_grads[self._position[id(B)]]

    def adopt_grads(self, B: Block, params: list[ParamSlot]) -> None:
        """A gradient the user put in place of the home one (``p.grad = g * 2``, not in
        place) copied home: an update reads the home gradients."""
        torch = import_torch()
        for p in params:
            g = p.param.grad
            home = piece(B.grads, p)
            if g.data_ptr() != home.data_ptr():
                with torch.no_grad():
                    home.copy_(g.reshape(-1))

    def invalidate(self, B: Block) -> None:
        """The block's home weights are about to change (or have): forget its device
        copy, at once, or when it is let go if it is bound now (a backward pass that
        raised may leave it so)."""
        k = self._position[id(B)]
        if k in self._held:
            self._stale.add(k)
        else:
            self.ring.invalidate(k)

    def close(self) -> None:
        """Remove the hooks and free the ring (the parameters stay home)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for B in list(self.blocks):
            self._let_go(B)
        self._adder.shutdown(wait=True)
        if self._cpu_adder is not None:
            self._cpu_adder.close()
        self._bound.clear()
        self.ring.close()
