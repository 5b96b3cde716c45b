"""A whole model trained with its optimizer state, and optionally its weights, on a
memory tier: the blocks' fp32 master weights and Adam moments live on the tier, and each
block's update runs where it is fastest.

``ModelOffload(model, ...)`` finds the model's repeated blocks (a Hugging Face model's
decoder layers: the largest ``ModuleList`` of modules of one type, see offload/layout.py) and
moves their optimizer state onto the tier. Their weights either stay on the GPU
(``weights="resident"``) or live on the tier too and visit the GPU only while their
block runs (``weights="stream"``, see offload/block_weights.py: for a model larger than HBM).
``offload.optimizer`` is a ``torch.optim.Optimizer``: gradients accumulate in
``param.grad`` as in plain PyTorch (for streamed blocks, CPU tensors on the tier), so
gradient accumulation, clipping by global norm, GradScaler, learning-rate schedulers and
activation checkpointing see an ordinary model. Its ``step()`` updates:

- each block planned for the GPU: its state (and, streamed, its gradients) is copied
  from the tier in pieces into three small device buffers, updated there by PyTorch's
  fused CUDA Adam and copied back (with the new weights, streamed), the copies of the
  next and the last piece running beside the update (the link carries both directions);
- each block planned for the CPU: the fused CPU step of native/adam.c reads its
  gradients on the tier (copied there first, resident), updates master and moments in
  one pass and writes the weights in the model's precision (copied to the GPU,
  resident; in their home, streamed);
- the rest of the model (embeddings, norm, head): fp32 masters and moments in HBM,
  PyTorch's fused CUDA Adam.

Both sides run at once; ``update_plan`` splits the blocks so that they finish together,
from rates measured at set-up and refined from the first steps' timings. With
``overlap`` (the default on a GPU) ``step()`` returns once the update is under way, and
each block's next forward pass waits for its own update only: the update runs beside
the next forward pass. Reading the weights outside a forward pass: ``model.state_dict()``
and ``optimizer.state_dict()`` wait by themselves; anything else calls
``synchronize()`` first.

With ``update_in_backward`` (for loops that step after every backward pass, on the
gradients as it made them) the CPU side begins in the backward pass: once a block's
gradients have all arrived (streamed: on their way home), its CPU step is under way,
the last blocks first, while autograd computes the earlier blocks' gradients; ``step()`` then
starts the GPU side on the first blocks (update_plan splits them so both finish
soonest). Gradient accumulation and anything that changes the gradients or the settings
between the backward pass and ``step()`` cannot work so: a second backward pass before
``step()``, a gradient changed in place (clipping, GradScaler's unscaling), a learning
rate set before ``step()``, or ``zero_grad()`` with no ``step()`` after a backward pass
that updated blocks, is refused by name, and the loop may go on from there.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

from ...errors import InvalidRequestError
from .._import import import_torch
from .adam import AdamSettings, CpuAdam, gpu_adam_step
from .block_weights import BlockStream
from .layers import HostAlloc
from .layout import Block, ParamSlot, chunks_of, find_blocks, layout_blocks, piece
from .update_plan import StepTimes, UpdatePlan, format_blocks, plan_split, refined

Update = Literal["auto", "cpu", "gpu"]
Weights = Literal["resident", "stream"]
GPU_SLOTS = 3  # copy in, update, copy out
CHUNK_ELEMENTS = 1 << 23  # the GPU side's piece: 8 Mi elements, 160 MiB of buffers each


def _optimizer_class() -> type:
    """``TierOptimizer``: a torch.optim.Optimizer (schedulers and GradScaler take it)
    whose step is the offload's."""
    torch = import_torch()

    class TierOptimizer(torch.optim.Optimizer):  # type: ignore[misc,name-defined]
        """Adam or AdamW over a model whose blocks' state is on a tier: ``step()``
        updates every parameter (see pycxl.torch.offload.model); ``param_groups`` are the
        ones given, so a scheduler's learning rate is the one used."""

        def __init__(
            self, offload: ModelOffload, groups: list[dict[str, Any]], defaults: dict[str, Any]
        ) -> None:
            super().__init__(groups, defaults)
            self._offload = offload

        def step(self, closure: Callable[[], Any] | None = None) -> Any:
            self._offload._check_open()
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            self._offload._step(self.param_groups)
            return loss

        def zero_grad(self, set_to_none: bool = True) -> None:
            if not set_to_none:  # zeroing in place: not under an update still reading them
                self._offload.synchronize()
            try:
                self._offload._unstepped()
            finally:
                super().zero_grad(set_to_none)

        def state_dict(self) -> dict[str, Any]:
            return self._offload._state_dict(super().state_dict())

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            groups = state_dict.get("param_groups", [])
            if len(groups) != len(self.param_groups):
                raise InvalidRequestError(
                    f"the state dict has {len(groups)} param groups, this optimizer "
                    f"{len(self.param_groups)}: load one saved by an optimizer over the same groups"
                )
            self._offload._load_state_dict(state_dict)
            for mine, theirs in zip(self.param_groups, groups, strict=True):
                mine.update({k: v for k, v in theirs.items() if k != "params"})

    return TierOptimizer


class ModelOffload:
    """See the module's text. ``host_alloc`` gives host memory on the tier (pinned for
    a GPU); ``cpus`` run the CPU step; ``optimizer`` is a torch Adam or AdamW over the
    model's parameters (its param groups and settings are used), or a factory that
    makes one from a list of parameters."""

    def __init__(
        self,
        model: Any,
        host_alloc: HostAlloc,
        *,
        device: Any,
        engine: Any,
        cpus: Sequence[int],
        optimizer: Any,
        blocks: Iterable[Any] | None = None,
        update: Update = "auto",
        weights: Weights = "resident",
        lookahead: int = 1,
        overlap: bool = True,
        update_in_backward: bool = False,
    ) -> None:
        torch = import_torch()
        if update not in ("auto", "cpu", "gpu"):
            raise InvalidRequestError(f"update {update!r}: give 'auto', 'cpu' or 'gpu'")
        if weights not in ("resident", "stream"):
            raise InvalidRequestError(f"weights {weights!r}: give 'resident' or 'stream'")
        if not isinstance(overlap, bool):
            raise InvalidRequestError(f"overlap {overlap!r}: give True or False")
        if not isinstance(update_in_backward, bool):
            raise InvalidRequestError(
                f"update_in_backward {update_in_backward!r}: give True or False"
            )
        self.device = torch.device(device)
        self._on_gpu = self.device.type == "cuda"
        if self._on_gpu:
            from ..tier import spilling

            if spilling() is not None:
                raise InvalidRequestError(
                    "this process spills CUDA memory onto a tier (spill_to, pycxl spill): "
                    "its allocator does not keep a tensor for the streams that still read "
                    "it, which offload_model's copies need; train it without the spill"
                )
        if update == "gpu" and not self._on_gpu:
            raise InvalidRequestError("update='gpu' needs a GPU: name one, or use 'cpu'")
        self.model = model
        self.engine = engine
        self.weights: Weights = weights
        self._host_alloc = host_alloc
        modules = list(blocks) if blocks is not None else find_blocks(model)
        base = (
            optimizer(list(model.parameters()))
            if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer)
            else optimizer
        )
        self._group_of, groups = self._groups(model, base)
        self._decoupled = isinstance(base, torch.optim.AdamW)
        self._blocks = layout_blocks(modules, self._group_of, with_frozen=weights == "stream")
        in_blocks = {id(p.param) for B in self._blocks for p in B.everything}
        if weights == "stream":
            self._move_rest(model, in_blocks)
        else:
            self._check_on_device(model)
        self._rest = [p for p in model.parameters() if p.requires_grad and id(p) not in in_blocks]
        self._steps = 0  # step() calls; each parameter counts its own Adam steps
        self._closed = False
        self._place_state()
        self._rest_state = self._place_rest()
        self._rest_steps = {id(p): 0 for p in self._rest}
        self._cpu = CpuAdam(cpus)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="pycxl-cpu-adam")
        self.times = StepTimes()
        # the CPU side's first block's start and last block's end this step: its rate
        # counts the waits between (for gradients to land behind the link's other traffic;
        # in a backward pass slower than the CPU side, for them to be made, too)
        self._cpu_first = self._cpu_end = 0.0
        self._began_at = 0.0  # when this step's update began (in the backward pass: the
        self._from_backward = False  # first block's gradients), and whether it did there
        self._step_called = 0.0  # when step() was called (the host's clock)
        # resident on a GPU, the update's times are taken on the device's clock (the host
        # runs ahead of it): the CPU side ends where its weights' copy in does
        self._device_clock = self._on_gpu and weights == "resident"
        self._in_backward = update_in_backward
        self._begun = False  # this step's update begun (in the backward pass)
        self._step_settings: list[AdamSettings] = []
        # blocks whose CPU step began in this backward pass: the gradient of each of their
        # parameters it read, and that gradient's version then (changed: refused at step())
        self._early: dict[int, list[tuple[ParamSlot, Any, int]]] = {}
        self._arrived: dict[int, int] = {}  # parameters with a gradient, by block
        # CPU steps begun in the backward pass and not yet run: the worker takes the last
        # block first while gradients arrive, the first block first after step() (the
        # next forward pass needs it first)
        self._waiting: list[tuple[Block, list[ParamSlot], list[AdamSettings], Future[None]]] = []
        self._waiting_lock = threading.Lock()
        self._backward_order = True
        # the GPU side's parameters this step, by whether begun in the backward pass (each
        # kind timed by a pair of events, from its first block's copy in to its last out)
        self._gpu_timed: dict[bool, int] = {}
        self._untimed = False  # this step was refused: its times would mislead the plan
        self._next_slot = 0  # the GPU side's next device buffer, across its calls in a step
        self._slots: list[tuple[Any, Any]] = []
        self._chunk = min(CHUNK_ELEMENTS, max(B.numel for B in self._blocks))
        if self._on_gpu:
            from ...gpu.cuda_engine import CudaEngine
            from ...gpu.streams import Event

            # the GPU side's state has copy streams of its own: the next forward pass's
            # copies (and the CPU side's weights) do not queue behind the whole update
            self._state = CudaEngine(engine.ctx)
            self._update_stream = torch.cuda.Stream(self.device)
            self._events = {
                name: [engine.event() for _ in range(GPU_SLOTS)]
                for name in ("loaded", "updated", "free")
            }
            self._gpu_timing = {early: (Event(), Event()) for early in (False, True)}
            self._at_step = Event()  # step() on the device: the backward pass's work done
            self._began = Event()  # the update's beginning there
            self._cpu_done = Event()  # the CPU side's last weights copied in
        self.stream: BlockStream | None = None
        if weights == "stream":
            self.stream = BlockStream(
                self._blocks, engine, self.device, lookahead=lookahead,
                before_copy=self._before_copy, host_alloc=self._gradient_memory,
                on_home=self._gradients_sent_home if update_in_backward else None,
            )  # fmt: skip
        self._overlap = overlap and self._on_gpu
        self._hooks: list[Any] = []
        if self._overlap and weights == "resident":
            for B in self._blocks:
                self._hooks.append(B.module.register_forward_pre_hook(self._forward_waiter(B)))
        if update_in_backward and weights == "resident":
            for B in self._blocks:
                for p in B.params:
                    self._hooks.append(p.param.register_post_accumulate_grad_hook(
                        functools.partial(self._gradient_arrived, B)))  # fmt: skip
        self._hooks.append(model.register_state_dict_pre_hook(self._before_model_state))
        self._hooks.append(model.register_load_state_dict_pre_hook(self._before_model_load))
        self._hooks.append(model.register_load_state_dict_post_hook(self._after_model_load))
        self._fixed = update != "auto"
        self._plan = self._first_plan(update)
        self.optimizer = _optimizer_class()(self, groups, dict(base.defaults))

    # --- set-up ------------------------------------------------------------------------
    def _groups(self, model: Any, base: Any) -> tuple[dict[int, int], list[dict[str, Any]]]:
        """Each parameter's group, the groups' settings checked once here."""
        known = {id(p) for p in model.parameters()}
        group_of: dict[int, int] = {}
        groups = []
        for g, group in enumerate(base.param_groups):
            AdamSettings.of(base, group)  # refused here, not at the first step
            for p in group["params"]:
                if id(p) not in known:
                    raise InvalidRequestError("the optimizer holds a parameter the model has not")
                group_of[id(p)] = g
            groups.append(dict(group))
        missing = [
            n for n, p in model.named_parameters() if p.requires_grad and id(p) not in group_of
        ]
        if missing:
            raise InvalidRequestError(
                f"the optimizer does not update {missing[0]} (and {len(missing) - 1} more): "
                "give it all the model's trainable parameters"
            )
        return group_of, groups

    def _check_on_device(self, model: Any) -> None:
        for name, p in model.named_parameters():
            if p.device != self.device:
                raise InvalidRequestError(
                    f"{name} is on {p.device}, not {self.device}: move the model there "
                    "first (model.to(device)), or stream its blocks (weights='stream')"
                )

    def _move_rest(self, model: Any, in_blocks: set[int]) -> None:
        """Streamed: what is not a block's parameter (embeddings, norm, head, every
        buffer) onto the device; the blocks' parameters go home (BlockStream)."""
        torch = import_torch()
        with torch.no_grad():
            for p in model.parameters():
                if id(p) not in in_blocks and p.device != self.device:
                    p.data = p.data.to(self.device)
            for module in model.modules():
                for name, buf in module._buffers.items():
                    if buf is not None and buf.device != self.device:
                        module._buffers[name] = buf.to(self.device)

    def _place_state(self) -> None:
        torch = import_torch()
        pinned = self._on_gpu
        for B in self._blocks:
            size = B.dtype.itemsize
            state = self._host_alloc(3 * B.numel * 4, pinned).view(torch.float32).zero_()
            with torch.no_grad():
                for p in B.params:
                    B.part(state, 0, p).copy_(p.param.detach().reshape(-1))
            B.state = state
            if self.weights == "stream":
                B.weights = self._host_alloc(B.total * size, pinned).view(B.dtype).zero_()
                B.grads = self._host_alloc(B.numel * size, pinned).view(B.dtype).zero_()
            elif self._on_gpu:
                B.grads = self._host_alloc(B.numel * size, True).view(B.dtype)
                B.weights = self._host_alloc(B.numel * size, True).view(B.dtype)
            if self._on_gpu:
                B.landed, B.updated = self.engine.event(), self.engine.event()

    def _gradient_memory(self, B: Block) -> Any:
        """More host memory like the block's gradients, on the tier (BlockStream's, for
        a later micro-batch)."""
        return self._host_alloc(B.numel * B.dtype.itemsize, self._on_gpu).view(B.dtype)

    def _place_rest(self) -> list[tuple[Any, Any, Any, Any]]:
        """(param, fp32 master, exp_avg, exp_avg_sq) in the device's memory for the
        parameters outside the blocks; the master is the parameter when it is fp32."""
        torch = import_torch()
        out = []
        for p in self._rest:
            master = p.data if p.dtype == torch.float32 else p.detach().float()
            out.append((p, master, torch.zeros_like(master), torch.zeros_like(master)))
        return out

    # --- the plan ----------------------------------------------------------------------
    def _gpu_buffers(self) -> list[tuple[Any, Any]]:
        """The GPU side's device buffers, made when it first has work (a plan that puts
        every block on the CPU takes no GPU memory for them)."""
        if not self._slots:
            torch = import_torch()
            low = self._blocks[0].dtype
            self._slots = [
                (torch.empty(4 * self._chunk, dtype=torch.float32, device=self.device),
                 torch.empty(2 * self._chunk, dtype=low, device=self.device))
                for _ in range(GPU_SLOTS)
            ]  # fmt: skip
            # their memory may be what the compute stream freed and has not finished with
            made = self._record(torch.cuda.current_stream(self.device))
            for stream in (self._state.copy_in_stream, self._state.copy_out_stream):
                self._state.wait(stream, made)
            self._state.wait(self._update_stream, made)
        return self._slots

    def _first_plan(self, update: str) -> UpdatePlan:
        everything = tuple(B.index for B in self._blocks)
        if not self._on_gpu:
            return UpdatePlan(everything, (), None, None, None, "no GPU: the CPU updates all")
        if update == "cpu":
            return UpdatePlan(everything, (), None, None, None, "fixed: update='cpu'")
        if update == "gpu":
            return UpdatePlan((), everything, None, None, None, "fixed: update='gpu'")
        cpu_rate, gpu_rate = self._measure_rates()
        # begun in the backward pass: the CPU's head start is not known before a step
        head = 0.0 if self._in_backward else None
        why = "rates measured at set-up"
        return plan_split(self._sizes(), cpu_rate, gpu_rate, why, head_s=head,
                          gpu_begins=self.stream is None)  # fmt: skip

    def _sizes(self) -> dict[int, int]:
        return {B.index: B.numel for B in self._blocks}

    def _bytes_per_param(self) -> int:
        """What the GPU side moves over the link each way for a parameter: master and
        moments, and streamed, the gradient in and the weight out."""
        low = self._blocks[0].dtype.itemsize
        return 12 + (low if self.weights == "stream" else 0)

    def _measure_rates(self) -> tuple[float, float]:
        """Parameters per second of each side: the CPU step on the largest block with
        a zero learning rate and zero gradients (the state is zero at set-up and stays
        so; the weights written are the ones there), and the link carrying a piece of
        state both ways at once, divided by what a parameter moves."""
        from ...gpu.streams import Event

        torch = import_torch()
        B = max(self._blocks, key=lambda b: b.numel)
        settings = AdamSettings(0.0, (0.9, 0.999), 1e-8, 0.0, True, False)
        grads = B.grads.zero_()
        cpu_s = gpu_s = float("inf")
        for _ in range(2):  # the first warms caches and page tables
            t0 = time.perf_counter()
            for p in B.params:
                self._cpu_step(B, p, piece(grads, p), 1, settings, piece(B.weights, p))
            cpu_s = min(cpu_s, time.perf_counter() - t0)
        eng = self._state
        n = 3 * self._chunk * 4
        host = eng.host_span(B.state)
        host = (host[0], min(n, host[1]))
        into, out_of = ((s[0].data_ptr(), host[1]) for s in self._gpu_buffers()[:2])
        eng.copy_in(out_of, host)  # what goes back is what is there
        start, end_in, end_out = Event(), Event(), Event()
        for _ in range(3):
            start.record(_stream(eng.copy_in_stream))
            eng.wait(eng.copy_out_stream, start)
            eng.copy_in(into, host)
            eng.copy_out(host, out_of)
            end_in.record(_stream(eng.copy_in_stream))
            end_out.record(_stream(eng.copy_out_stream))
            end_in.synchronize()
            end_out.synchronize()
            gpu_s = min(gpu_s, max(end_in.ms_since(start), end_out.ms_since(start)) / 1e3)
        torch.cuda.synchronize(self.device)
        link = host[1] / gpu_s  # bytes per second each way
        return B.numel / cpu_s, link / self._bytes_per_param()

    def plan(self) -> UpdatePlan:
        """Which blocks are updated on the CPU and which on the GPU, and why."""
        return self._plan

    def set_plan(self, *, gpu: Iterable[int], gpu_early: Iterable[int] = ()) -> UpdatePlan:
        """Update the blocks ``gpu`` on the GPU and the rest on the CPU, from now on
        (the timings no longer move the split); ``gpu_early``: those of ``gpu`` whose
        update begins in the backward pass, as their gradients arrive (with
        ``update_in_backward=True`` and the weights resident)."""
        chosen = sorted(set(gpu))
        early = sorted(set(gpu_early), reverse=True)  # the order their gradients come in
        known = {B.index for B in self._blocks}
        bad = [i for i in chosen + early if i not in known]
        if bad:
            raise InvalidRequestError(
                f"blocks {bad}: this model's blocks are {format_blocks(sorted(known))}"
            )
        if chosen and not self._on_gpu:
            raise InvalidRequestError("no GPU to update blocks on: the CPU updates them all")
        if early and (not self._in_backward or self.stream is not None):
            raise InvalidRequestError(
                "gpu_early begins blocks in the backward pass: it needs "
                "update_in_backward=True and weights='resident'"
            )
        if not set(early) <= set(chosen):
            raise InvalidRequestError(
                f"gpu_early blocks {format_blocks(sorted(set(early) - set(chosen)))} are not "
                "among the GPU's (gpu=...): name them there too"
            )
        self.synchronize()
        cpu = tuple(i for i in sorted(known) if i not in chosen)
        self._fixed = True
        self._plan = UpdatePlan(
            cpu, tuple(chosen), self._plan.cpu_rate, self._plan.gpu_rate, None,
            "fixed by set_plan", self._in_backward, gpu_early=tuple(early),
        )  # fmt: skip
        return self._plan

    # --- waiting for a block's update ----------------------------------------------------
    def _wait_for(self, B: Block, stream: Any) -> None:
        """Until ``B``'s last update is done: the host for its CPU step (an error of the
        step is raised here), ``stream`` for the copy or GPU update of its weights."""
        pending = B.cpu_update
        if pending is not None:
            pending.result()
        if self._on_gpu:
            self.engine.wait(stream, B.updated)

    def _forward_waiter(self, B: Block) -> Callable[..., None]:
        torch = import_torch()

        def before_forward(module: Any, args: Any) -> None:
            self._wait_for(B, torch.cuda.current_stream(self.device))

        waiter: Callable[..., None] = torch.compiler.disable(before_forward)
        return waiter  # a compiled model calls it as it is

    def _before_copy(self, position: int) -> None:
        """Streamed: before the ring copies a block's home weights to the device."""
        self._wait_for(self._blocks[position], self.engine.copy_in_stream)

    # --- the step ----------------------------------------------------------------------
    def _settings(self, groups: list[dict[str, Any]]) -> list[AdamSettings]:
        """Each group's settings now (a scheduler may move lr, and betas too)."""
        out = []
        for g in groups:
            lr = g["lr"]
            lr = float(lr.item()) if hasattr(lr, "item") else float(lr)
            out.append(AdamSettings.from_group(g, lr=lr, decoupled=self._decoupled))
        return out

    def _settle(self) -> None:
        """The last step's update, finished: its CPU side waited for (its error raised),
        both sides' times taken, and the split refined from them."""
        for B in self._blocks:
            if B.cpu_update is not None:
                B.cpu_update.result()
                B.cpu_update = None
        if self._steps == 0:
            return
        timed, self._gpu_timed = self._gpu_timed, {}
        if self._untimed:  # a refused step's update ran in part: not one to plan from
            self._untimed = False
            return
        gpu_s, gpu_after_s = self._gpu_seconds(timed)
        head_s, cpu_after_s = self._head_and_cpu_after()
        self.times.add(
            cpu_s=self._cpu_end - self._cpu_first, gpu_s=gpu_s, head_s=head_s,
            gpu_after_s=gpu_after_s, cpu_after_s=cpu_after_s,
        )  # fmt: skip
        if not self._fixed and self._on_gpu:
            new = refined(self._plan, self._sizes(), self.times, gpu_begins=self.stream is None)
            if new is not None:
                self._plan = new

    def _head_and_cpu_after(self) -> tuple[float, float]:
        """The last step's seconds from the update's beginning in the backward pass to
        step() (0 where it began at step()), and the CPU side's seconds after step()."""
        if not self._device_clock:
            head = self._step_called - self._began_at if self._from_backward else 0.0
            after = self._cpu_end - self._step_called if self._cpu_first else 0.0
            return head, max(0.0, after)
        self._at_step.synchronize()
        head = self._at_step.ms_since(self._began) / 1e3 if self._from_backward else 0.0
        if not self._cpu_first:
            return head, 0.0
        self._cpu_done.synchronize()
        return head, max(0.0, self._cpu_done.ms_since(self._at_step) / 1e3)

    def _gpu_seconds(self, timed: dict[bool, int]) -> tuple[float, float]:
        """The GPU side's seconds for all its blocks of the last step, at the rate of
        those begun at step() (those begun in the backward pass wait for gradients
        between blocks; where it began them all there, at theirs), and its seconds after
        step() on the device."""
        if not timed:
            return 0.0, 0.0
        self._at_step.synchronize()
        seconds, after = {}, 0.0
        for early in timed:
            start, end = self._gpu_timing[early]
            end.synchronize()
            seconds[early] = end.ms_since(start) / 1e3
            after = max(after, end.ms_since(self._at_step) / 1e3)
        basis = False not in timed  # at step() where there were any
        return sum(timed.values()) * seconds[basis] / timed[basis], after

    def _begin(self, groups: list[dict[str, Any]]) -> None:
        """This step's update begins (at step(), or in the backward pass): the last
        one's finished, and the settings of what begins in the backward pass taken."""
        if not self._begun:
            self._settle()
            self._step_settings = self._settings(groups)
            self._steps += 1
            self._cpu_first = self._cpu_end = 0.0
            self._began_at = time.perf_counter()
            if self._device_clock:  # where autograd (or the loop) has got to
                torch = import_torch()
                self.engine.record(self._began, torch.cuda.current_stream(self.device))
            self._begun = True

    def _gradient_arrived(self, B: Block, param: Any) -> None:
        """update_in_backward, resident: a parameter's gradient was accumulated; once
        the block's are all there, its CPU step begins (a block the plan gives the GPU
        waits for step())."""
        n = self._arrived.get(B.index, 0) + 1
        self._arrived[B.index] = n
        if n < len(B.params):
            return
        self._arrived[B.index] = 0
        side = self._begin_early(B, again=B.index in self._early)
        if side is None:
            return
        params = [p for p in B.params if p.param.grad is not None]
        self._early[B.index] = [(p, p.param.grad, p.param.grad._version) for p in params]
        if side == "gpu":
            self._early_gpu_step(B, params)
            return
        if self._on_gpu:
            torch = import_torch()
            current = torch.cuda.current_stream(self.device)
            self._copy_grads_out([B], {B.index: params}, current)
        self._early_cpu_step(B, params)

    def _gradients_sent_home(self, B: Block, adding: bool) -> None:
        """update_in_backward, streamed: the block's gradients are all on their way home
        (BlockStream), onto the earlier micro-batch's where ``adding``."""
        assert self.stream is not None
        # added onto an earlier micro-batch's (the adder thread's work): left for step();
        # the GPU side begins none in the backward pass here (gpu_begins=False)
        if self._begin_early(B, again=B.index in self._early) != "cpu" or adding:
            return
        homes = self.stream.home_grads(B)
        self._early[B.index] = [(p, g, g._version) for p, g in zip(B.params, homes, strict=True)]
        self._early_cpu_step(B, B.params)

    def _begin_early(self, B: Block, *, again: bool) -> Literal["cpu", "gpu"] | None:
        """The side whose step of ``B`` begins now, in the backward pass: "cpu" where the
        plan gives the CPU the block, "gpu" where it begins the GPU's there, None where
        it waits for step(); ``again``: a second backward pass reached it before step()."""
        if again:
            self._forget_early()  # the loop may go on from its next step
            raise InvalidRequestError(
                f"block {B.index} took gradients again before optimizer.step(): with "
                "update_in_backward=True each backward pass updates the blocks; for "
                "gradient accumulation over micro-batches use update_in_backward=False"
            )
        self._check_open()
        self._begin(self.optimizer.param_groups)
        if B.index in self._plan.cpu:
            return "cpu"
        return "gpu" if B.index in self._plan.gpu_early else None

    def _early_gpu_step(self, B: Block, params: list[ParamSlot]) -> None:
        """Resident: ``B``'s GPU step, begun in the backward pass once the stream
        autograd runs on has made its gradients (the block's weights are not read
        again in this pass: its backward is done)."""
        torch = import_torch()
        for p in params:
            p.steps += 1
        produced = self._record(torch.cuda.current_stream(self.device))
        self._gpu_side([B], {B.index: params}, produced, self._step_settings, early=True)

    def _early_cpu_step(self, B: Block, params: list[ParamSlot]) -> None:
        """``B``'s CPU step, begun in the backward pass: at once without a GPU, else on
        the worker, after the gradients have landed."""
        settings = self._step_settings
        for p in params:
            p.steps += 1
        if not self._on_gpu:
            self._cpu_block(B, params, settings)
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
        B.cpu_update = done

    def _next_waiting(self) -> None:
        """The worker: one CPU step begun in the backward pass (each call runs one),
        the last block first during it, the first block first after step()."""
        with self._waiting_lock:
            pick = max if self._backward_order else min
            item = pick(self._waiting, key=lambda w: w[0].index)
            self._waiting.remove(item)
        B, params, settings, done = item
        try:
            self._cpu_block(B, params, settings)
        except BaseException as e:  # raised where the block's update is waited for
            done.set_exception(e)
        else:
            done.set_result(None)

    def _forget_early(self) -> list[int]:
        """This step's record of what began in the backward pass, cleared (the next
        backward pass starts afresh); the blocks it updated, whose device copies
        (streamed) are dropped: their home weights are new."""
        early = sorted(self._early)
        self._early = {}
        self._arrived.clear()
        self._begun = False
        self._untimed = True
        if self.stream is not None:
            for i in early:
                self.stream.invalidate(self._blocks[i])
        return early

    def _unstepped(self) -> None:
        """zero_grad(): a backward pass that began updating blocks and no step() came
        (GradScaler skipping a step, a refused step, a pass for its gradients alone) is
        refused by name; the record is cleared, so the loop may go on."""
        if not self._begun:
            self._arrived.clear()  # a backward pass that raised may have counted some
            return
        self.synchronize()
        early = self._forget_early()
        if early:
            raise InvalidRequestError(
                f"gradients cleared with no optimizer.step() after a backward pass that "
                f"updated blocks {format_blocks(early)} (update_in_backward=True: the "
                "rest of the model was not updated); a loop that skips steps (GradScaler) "
                "needs update_in_backward=False"
            )

    def _check_early(self, settings: list[AdamSettings]) -> None:
        """The blocks updated in the backward pass read their gradients as it made them,
        with the settings of then: a gradient changed since (clipped, unscaled,
        replaced), or settings changed since (a learning rate set before step()), is
        refused, and the step is not taken further."""
        changed = next(
            (
                index
                for index, seen in self._early.items()
                for p, grad, version in seen
                if p.param.grad is not grad or grad._version != version
            ),
            None,
        )
        moved = self._early and settings != self._step_settings
        if changed is None and not moved:
            return
        self.synchronize()
        early = format_blocks(self._forget_early())
        if changed is not None:
            raise InvalidRequestError(
                f"a gradient of block {changed} changed between the backward pass and "
                "step() (clipping, GradScaler, a gradient set by hand): with "
                f"update_in_backward=True blocks {early} were already updated from the "
                "backward pass's, the rest not; drop update_in_backward for such a loop"
            )
        raise InvalidRequestError(
            "the optimizer's settings (a learning rate) changed between the backward pass "
            f"and step(): with update_in_backward=True blocks {early} were already updated "
            "with the earlier ones, the rest not; set them before the backward pass (a "
            "scheduler's step() after optimizer.step() does) or drop update_in_backward"
        )

    def _step(self, groups: list[dict[str, Any]]) -> None:
        torch = import_torch()
        begun_in_backward = self._begun
        self._begin(groups)
        # what was begun in the backward pass took the settings of then; the rest, now's
        settings = self._settings(groups) if begun_in_backward else self._step_settings
        self._check_early(settings)
        self._begun = False
        early = set(self._early)
        self._early = {}
        self._arrived.clear()
        by_index = {B.index: B for B in self._blocks}
        # decided here: the user may clear the gradients while the update runs; each
        # parameter with one takes a step (its own count, as torch's Adam keeps it)
        live = {
            B.index: [] if B.index in early else [p for p in B.params if p.param.grad is not None]
            for B in self._blocks
        }
        for B in self._blocks:
            for p in live[B.index]:
                p.steps += 1
            if self.stream is not None:
                self._gradients_home(B, live[B.index])
        cpu_blocks = [by_index[i] for i in self._plan.cpu if live[i]]
        gpu_blocks = [by_index[i] for i in self._plan.gpu if live[i]]
        if self.stream is not None:
            # the blocks updated in the backward pass too: their device copies are free now
            for B in cpu_blocks + gpu_blocks + [by_index[i] for i in sorted(early)]:
                self.stream.invalidate(B)
        self._step_called = time.perf_counter()
        self._from_backward = begun_in_backward
        if not self._on_gpu:
            for B in cpu_blocks:
                self._cpu_block(B, live[B.index], settings)
            self._rest_step(settings)
            return
        current = torch.cuda.current_stream(self.device)
        self._at_step.record(_stream(current))
        with self._waiting_lock:
            self._backward_order = False  # every gradient is in: the forward pass's order
        if self.stream is None:
            self._copy_grads_out(cpu_blocks, live, current)
        produced = self._record(current)  # the backward pass's gradients
        for B in cpu_blocks:
            B.cpu_update = self._worker.submit(self._cpu_block, B, live[B.index], settings)
        if gpu_blocks:
            self._gpu_side(gpu_blocks, live, produced, settings)
        self._rest_step(settings)
        if not self._overlap:
            self.synchronize()

    def _gradients_home(self, B: Block, params: list[ParamSlot]) -> None:
        """Streamed: a gradient the user put in place of the home one (``p.grad = g *
        2``, not in place) is copied home: the update reads the home gradients."""
        torch = import_torch()
        for p in params:
            g = p.param.grad
            home = piece(B.grads, p)
            if g.data_ptr() != home.data_ptr():
                with torch.no_grad():
                    home.copy_(g.reshape(-1))

    def _record(self, stream: Any) -> Any:
        event = self.engine.event()
        self.engine.record(event, stream)
        return event

    def _copy_grads_out(
        self, blocks: list[Block], live: dict[int, list[ParamSlot]], current: Any
    ) -> None:
        """Resident: the CPU side's gradients to the tier, on the copy-out stream, once
        ``current`` has made them (contiguous copies included); each block's CPU step
        waits for its own. The gradients' memory is kept until then."""
        eng = self.engine
        kept = {B.index: [_grad_of(p) for p in live[B.index]] for B in blocks}
        eng.wait(eng.copy_out_stream, self._record(current))
        for B in blocks:
            base, _ = eng.host_span(B.grads)
            size = B.dtype.itemsize
            for p, g in zip(live[B.index], kept[B.index], strict=True):
                eng.copy_out(
                    (base + p.offset * size, p.numel * size), (g.data_ptr(), p.numel * size)
                )
            eng.record(B.landed, eng.copy_out_stream)
            B.kept = kept[B.index]

    def _cpu_block(self, B: Block, params: list[ParamSlot], settings: list[AdamSettings]) -> None:
        """One block's CPU step (on the worker thread, with a GPU): its gradients from
        the tier (resident: once landed), the weights written where the next forward
        pass reads them."""
        eng = self.engine
        resident_gpu = self._on_gpu and self.stream is None
        if resident_gpu:
            eng.synchronize(B.landed)
            B.kept = []  # landed: the memory may go
        elif self._on_gpu and B.landed is not None:
            eng.synchronize(B.landed)  # streamed: home (at step(), long since)
        began = time.perf_counter()  # one thread runs the blocks: no other writes the clock
        size = B.dtype.itemsize
        at = eng.host_span(B.weights)[0] if resident_gpu else 0
        for p in params:
            if B.grads is not None:  # the gradients on the tier
                grad, weight = piece(B.grads, p), piece(B.weights, p)
            else:  # the CPU, resident: the parameter's own
                grad, weight = _grad_of(p), p.param.data.view(-1)
            self._cpu_step(B, p, grad, p.steps, settings[p.group], weight)
            if resident_gpu:
                src = (at + p.offset * size, p.numel * size)
                eng.copy_in((p.param.data_ptr(), p.numel * size), src)
        if resident_gpu:
            eng.record(B.updated, eng.copy_in_stream)
            eng.record(self._cpu_done, eng.copy_in_stream)
        self._cpu_first = self._cpu_first or began
        self._cpu_end = time.perf_counter()

    def _cpu_step(
        self, B: Block, p: ParamSlot, grad: Any, step: int, settings: AdamSettings, weight: Any
    ) -> None:
        state = (B.part(B.state, 0, p), B.part(B.state, 1, p), B.part(B.state, 2, p))
        out = None if weight.data_ptr() == state[0].data_ptr() else weight
        self._cpu.step(state, grad, out, step, settings)

    def _gpu_side(
        self,
        blocks: list[Block],
        live: dict[int, list[ParamSlot]],
        produced: Any,
        settings: list[AdamSettings],
        *,
        early: bool = False,
    ) -> None:
        """Enqueue the GPU's blocks piece by piece: state (and streamed, gradients) in,
        fused update, state (and streamed, weights) out, through three device buffers;
        the host does not wait. ``early``: one block begun in the backward pass (timed
        apart from those begun at step(), from the first such block to the last)."""
        torch = import_torch()
        eng = self._state
        ev = self._events
        upd = self._update_stream
        streamed = self.stream is not None
        eng.wait(upd, produced)
        step_of: dict[int, Any] = {}  # step number -> its tensor, made on the update stream
        start, end = self._gpu_timing[early]
        if early not in self._gpu_timed:
            start.record(_stream(eng.copy_in_stream))
        self._gpu_timed[early] = self._gpu_timed.get(early, 0) + sum(B.numel for B in blocks)
        slots = self._gpu_buffers()
        c = self._chunk
        j = self._next_slot  # an early block's call follows the last one's buffers
        for B in blocks:
            state = eng.host_span(B.state)[0]
            grads = eng.host_span(B.grads)[0] if streamed else 0
            weights = eng.host_span(B.weights)[0] if streamed else 0
            low = B.dtype.itemsize
            params = live[B.index]
            for a, b, (g, n_step) in chunks_of(B, c, params, key=lambda p: (p.group, p.steps)):
                s = j % GPU_SLOTS
                j += 1
                n = b - a
                f32, lows = slots[s]
                master, m, v, g32 = (f32[k * c : k * c + n] for k in range(4))
                gin, wout = lows[:n], lows[c : c + n]
                eng.wait(eng.copy_in_stream, ev["free"][s])
                for k, t in enumerate((master, m, v)):
                    eng.copy_in((t.data_ptr(), n * 4), (state + (k * B.numel + a) * 4, n * 4))
                if streamed:
                    eng.copy_in((gin.data_ptr(), n * low), (grads + a * low, n * low))
                eng.record(ev["loaded"][s], eng.copy_in_stream)
                eng.wait(upd, ev["loaded"][s])
                with torch.cuda.stream(upd):
                    if n_step not in step_of:
                        step_of[n_step] = torch.full((), float(n_step), device=self.device)
                    if streamed:
                        g32.copy_(gin)
                    else:
                        _gather_grads(g32, a, b, params, upd)
                    gpu_adam_step([master], [g32], [m], [v], step_of[n_step], settings[g])
                    if streamed:
                        wout.copy_(master)
                    else:
                        _scatter_weights(master, a, b, params)
                eng.record(ev["updated"][s], upd)
                eng.wait(eng.copy_out_stream, ev["updated"][s])
                for k, t in enumerate((master, m, v)):
                    eng.copy_out((state + (k * B.numel + a) * 4, n * 4), (t.data_ptr(), n * 4))
                if streamed:
                    eng.copy_out((weights + a * low, n * low), (wout.data_ptr(), n * low))
                eng.record(ev["free"][s], eng.copy_out_stream)
            # where the next forward pass finds the block's new weights
            eng.record(B.updated, eng.copy_out_stream if streamed else upd)
        end.record(_stream(eng.copy_out_stream))
        self._next_slot = j % GPU_SLOTS

    def _rest_step(self, settings: list[AdamSettings]) -> None:
        """The parameters outside the blocks, in the device's memory."""
        torch = import_torch()
        live = [(p, m, a, b) for p, m, a, b in self._rest_state if p.grad is not None]
        if not live:
            return
        for p, *_ in live:
            self._rest_steps[id(p)] += 1
        if not self._on_gpu:
            for p, m, a, b in live:
                grad = (
                    p.grad.reshape(-1) if p.grad.is_contiguous() else p.grad.contiguous().view(-1)
                )
                weight = None if m.data_ptr() == p.data.data_ptr() else p.data.view(-1)
                self._cpu.step(
                    (m.view(-1), a.view(-1), b.view(-1)),
                    grad,
                    weight,
                    self._rest_steps[id(p)],
                    settings[self._group_of[id(p)]],
                )
            return
        by_group: dict[tuple[int, int], list[tuple[Any, Any, Any, Any]]] = {}
        for entry in live:
            key = (self._group_of[id(entry[0])], self._rest_steps[id(entry[0])])
            by_group.setdefault(key, []).append(entry)
        for (g, n_step), entries in by_group.items():
            step_t = torch.full((), float(n_step), dtype=torch.float32, device=self.device)
            grads = [
                p.grad.float() if p.grad.dtype != torch.float32 else p.grad for p, *_ in entries
            ]
            gpu_adam_step(
                [m for _, m, _, _ in entries],
                grads,
                [a for *_, a, _ in entries],
                [b for *_, b in entries],
                step_t,
                settings[g],
            )
            for p, m, _, _ in entries:
                if m.data_ptr() != p.data.data_ptr():
                    p.data.copy_(m)

    # --- the model's own state ---------------------------------------------------------
    def _before_model_state(self, module: Any, prefix: str, keep_vars: bool) -> None:
        self.synchronize()  # the weights of an update in flight are not the ones saved

    def _before_model_load(self, module: Any, *args: Any) -> None:
        self.synchronize()  # an update in flight would write over what is loaded

    def _after_model_load(self, module: Any, incompatible: Any) -> None:
        """The model's weights were loaded: the masters follow them (an optimizer
        state loaded after this sets the saved fp32 masters)."""
        torch = import_torch()
        self.synchronize()
        with torch.no_grad():
            for B in self._blocks:
                for p in B.params:
                    B.part(B.state, 0, p).copy_(p.param.detach().reshape(-1))
                if self.stream is not None:
                    self.stream.invalidate(B)
            for p, master, _, _ in self._rest_state:
                if master.data_ptr() != p.data.data_ptr():
                    master.copy_(p.detach())

    # --- what users ask ------------------------------------------------------------------
    def host_tensors(self) -> list[Any]:
        """The host memory on the tier: each block's state, and its gradients and
        weights where they are kept there."""
        out = []
        for B in self._blocks:
            out += [t for t in (B.state, B.grads, B.weights, B.incoming) if t is not None]
        return out

    def pages_by_node(self) -> dict[int, int]:
        """Pages of the offload's host memory per NUMA node, counted now."""
        from collections import Counter

        from ...numa.pages import pages_by_node

        total: Counter[int] = Counter()
        for t in self.host_tensors():
            total.update(pages_by_node(t))
        return dict(sorted(total.items()))

    def master_weights(self, param: Any) -> Any:
        """The fp32 master copy of a block's parameter (a view of the tier's memory)."""
        self.synchronize()
        for B in self._blocks:
            for p in B.params:
                if p.param is param:
                    return B.part(B.state, 0, p).view(param.shape)
        for p, m, _, _ in self._rest_state:
            if p is param:
                return m
        raise InvalidRequestError("not a parameter this offload updates")

    def _entries(self) -> list[tuple[Any, Any, Any, Any]]:
        """(param, master, exp_avg, exp_avg_sq) of every parameter, blocks' first."""
        out = []
        for B in self._blocks:
            for p in B.params:
                out.append((p.param, *(B.part(B.state, k, p).view(p.shape) for k in range(3))))
        return out + list(self._rest_state)

    def _state_dict(self, base: dict[str, Any]) -> dict[str, Any]:
        """The optimizer's state as torch's Adam saves it (by parameter index, fp32
        tensors copied off the tier), with each parameter's fp32 master beside it."""
        self.synchronize()
        index = {
            id(p): i
            for i, p in enumerate(p for g in self.optimizer.param_groups for p in g["params"])
        }
        state = {}
        torch = import_torch()
        steps = self._param_steps()
        for p, master, a, b in self._entries():
            state[index[id(p)]] = {
                "step": torch.tensor(float(steps[id(p)])),
                "exp_avg": a.detach().cpu().clone(),
                "exp_avg_sq": b.detach().cpu().clone(),
                "master": master.detach().cpu().clone(),
            }
        return {"state": state, "param_groups": base["param_groups"]}

    def _param_steps(self) -> dict[int, int]:
        """Each updated parameter's Adam steps, by its id."""
        out = {id(p.param): p.steps for B in self._blocks for p in B.params}
        return out | self._rest_steps

    def _load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch = import_torch()
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        saved = state_dict.get("state", {})
        entries = {id(e[0]): e for e in self._entries()}
        checked = []
        for i, p in enumerate(params):
            if id(p) not in entries:
                continue
            st = saved.get(i)
            if st is None or not {"exp_avg", "exp_avg_sq", "master", "step"} <= st.keys():
                raise InvalidRequestError(
                    f"the state dict has no master and moments for parameter {i}: load one "
                    "saved by this optimizer"
                )
            for key in ("master", "exp_avg", "exp_avg_sq"):
                if tuple(st[key].shape) != tuple(p.shape):
                    raise InvalidRequestError(
                        f"parameter {i}: saved {key} of shape {tuple(st[key].shape)}, the "
                        f"model's {tuple(p.shape)}: load a state dict of this model"
                    )
            checked.append((entries[id(p)], st))
        self.synchronize()
        with torch.no_grad():
            for (p, master, a, b), st in checked:
                master.copy_(st["master"])
                a.copy_(st["exp_avg"])
                b.copy_(st["exp_avg_sq"])
                p.data.copy_(master.view(p.shape))
        if self.stream is not None:
            for B in self._blocks:
                self.stream.invalidate(B)
        saved_steps = {id(e[0]): int(st["step"]) for e, st in checked}
        for B in self._blocks:
            for p in B.params:
                p.steps = saved_steps.get(id(p.param), p.steps)
        for ident in self._rest_steps:
            self._rest_steps[ident] = saved_steps.get(ident, self._rest_steps[ident])
        self._steps = max(saved_steps.values(), default=0)

    def synchronize(self) -> None:
        """Wait for the update in flight: every block's step, every copy."""
        for B in self._blocks:
            if B.cpu_update is not None:
                B.cpu_update.result()
        if self._on_gpu:
            import_torch().cuda.synchronize(self.device)

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidRequestError(
                "this offload was closed: make a new one (pycxl.offload_model) to train on"
            )

    def close(self) -> None:
        """Wait for what is in flight, remove the hooks, stop the CPU step's threads
        and free the device buffers (streamed parameters stay home, on the tier).
        Twice is once."""
        if self._closed:
            return
        self._closed = True
        try:
            self.synchronize()
        finally:
            self._release()

    def _release(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self.stream is not None:
            self.stream.close()
        self._worker.shutdown(wait=True)
        self._cpu.close()
        self._slots = []


def _grad_of(p: ParamSlot) -> Any:
    g = p.param.grad
    if not g.is_contiguous():
        g = g.contiguous()
    return g.view(-1)


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
        g = _grad_of(p)
        g32[lo - a : hi - a].copy_(g[lo - p.offset : hi - p.offset])
        g.record_stream(stream)
        p.param.grad.record_stream(stream)


def _scatter_weights(master: Any, a: int, b: int, params: list[ParamSlot]) -> None:
    """Resident: the new weights of [a, b) from the fp32 piece into the parameters."""
    for p in params:
        lo, hi = _span_in(a, b, p)
        if lo < hi:
            p.param.data.view(-1)[lo - p.offset : hi - p.offset].copy_(master[lo - a : hi - a])


def _stream(stream: Any) -> Any:
    from ...gpu.streams import Stream

    return Stream.borrow(stream)
