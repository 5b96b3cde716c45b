"""A whole model trained with its optimizer state, and optionally its weights, on a
memory tier: the blocks' fp32 master weights and Adam moments live on the tier, and each
block's update runs where it is fastest.

``ModelOffload(model, ...)`` finds the model's repeated blocks (a Hugging Face model's
decoder layers: the largest ``ModuleList`` of modules of one type, see layout.py) and
moves their optimizer state onto the tier. Their weights either stay on the GPU
(``weights="resident"``) or live on the tier too and visit the GPU only while their
block runs (``weights="stream"``, the ferry of ferry.py: for a model larger than HBM).
``offload.optimizer`` is a ``torch.optim.Optimizer`` (optimizer.py): gradients accumulate
in ``param.grad`` as in plain PyTorch (for streamed blocks, CPU tensors on the tier), so
gradient accumulation, clipping by global norm, GradScaler, learning-rate schedulers and
activation checkpointing see an ordinary model. Its ``step()`` updates each block planned
for the GPU on the GPU side (gpu_side.py), each block planned for the CPU on the CPU side
(cpu_side.py), and the rest of the model (embeddings, norm, head) in the device's memory
(rest.py).

Both sides run at once; ``update_split`` splits the blocks so that they finish together,
from rates measured at set-up and refined from the first steps' timings (clocks.py,
split_keeper.py).
With ``overlap`` (the default on a GPU) ``step()`` returns once the update is under way,
and each block's next forward pass waits for its own update only: the update runs beside
the next forward pass. Reading the weights outside a forward pass: ``model.state_dict()``
and ``optimizer.state_dict()`` (state.py) wait by themselves; anything else calls
``synchronize()`` first. With ``update_in_backward`` the update begins in the backward
pass (early.py, which says what such a loop cannot do).

This module is the step and what users ask; the set-up is model_setup.py's, the modes
one ``OffloadConfig`` (config.py).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ...base.errors import InvalidRequestError
from .._import import import_torch
from . import clipping, model_setup as setup, saving, state as saved
from .adam import AdamSettings, AdamSteps, CpuAdam
from .checkpoint import WeightSource, materialise
from .clocks import StepClock
from .config import OffloadConfig, Update, Weights
from .cpu_side import CpuSide
from .early import EarlyUpdate
from .ferry import WeightFerry
from .gpu_side import CHUNK_ELEMENTS, GpuSide
from .grad_norms import GradNorms
from .host_memory import HostAlloc, pages_of
from .initialise import ModelInit
from .layout import Block, ParamSlot, check_trainable, find_blocks, layout_blocks
from .optimizer import optimizer_class
from .rest import RestUpdate
from .split_keeper import SplitKeeper
from .update_split import StepTimes, UpdateSplit

__all__ = ["ModelOffload", "Update", "Weights"]


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
        hbm_blocks: int = 0,
        weights_from: WeightSource | ModelInit | None = None,
    ) -> None:
        torch = import_torch()
        self.config = config = OffloadConfig.checked(
            torch.device(device), weights=weights, update=update, overlap=overlap,
            update_in_backward=update_in_backward, lookahead=lookahead, hbm_blocks=hbm_blocks,
        )  # fmt: skip
        if config.on_gpu:
            from ..tier import spilling

            if spilling() is not None:
                raise InvalidRequestError(
                    "this process spills CUDA memory onto a tier (spill_to, pycxl spill): "
                    "its allocator does not keep a tensor for the streams that still read "
                    "it, which offload_model's copies need; train it without the spill"
                )
        self.model = model
        self.engine = engine
        self._host_alloc = host_alloc
        modules = list(blocks) if blocks is not None else find_blocks(model)
        base = (
            optimizer(list(model.parameters()))
            if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer)
            else optimizer
        )
        group_of, groups = setup.param_groups(model, base)
        self._decoupled = isinstance(base, torch.optim.AdamW)
        self._blocks = layout_blocks(modules, group_of, with_frozen=config.streamed)
        check_trainable(self._blocks)
        in_blocks = {id(p.param) for B in self._blocks for p in B.everything}
        setup.check_hbm_room(self._blocks, config)
        self._in_hbm = self._blocks[: config.hbm_blocks]
        self._on_tier = self._blocks[config.hbm_blocks :]  # the split's: the rest are the GPU's
        streamed = (  # what streams: the blocks on the tier; those in HBM stay on the device
            {id(p.param) for B in self._on_tier for p in B.everything} if config.streamed else set()
        )
        start: Callable[[Any], Any] | None = None
        if weights_from is not None:
            names = weights_from.names_of(model)  # checked before any memory is taken
            materialise(model, weights_from, names, self.device, keep=streamed)
            source = weights_from

            def start(param: Any) -> Any:  # the checkpoint's values (its precision), or made
                if made and not param.is_meta:  # made in its own precision, placed already
                    return param.detach()
                return source.read(names[id(param)])

            made = isinstance(source, ModelInit)

        else:
            setup.check_not_meta(model)
        if config.streamed:
            setup.move_rest(model, streamed, self.device)
        else:
            setup.check_on_device(model, self.device)
        self._stepped = False  # a step has begun: there is one to settle
        self._adam_steps = AdamSteps(p.param for B in self._blocks for p in B.params)
        self._closed = False
        setup.place_state(self._blocks, host_alloc, config, engine, start)
        if weights_from is not None:
            weights_from.close()  # every value is where it lives: the files are done with
        rest = [p for p in model.parameters() if p.requires_grad and id(p) not in in_blocks]
        self._rest = RestUpdate(rest, group_of, self.device, self._adam_steps)
        self._cpu = CpuSide(
            engine, cpus, self._adam_steps, on_gpu=config.on_gpu, streamed=config.streamed
        )
        self._gpu: GpuSide | None = None
        if config.on_gpu:
            chunk = min(CHUNK_ELEMENTS, max(B.numel for B in self._blocks))
            low = self._blocks[0].dtype
            self._gpu = GpuSide(engine, self.device, chunk, low, config.streamed, self._adam_steps)
        self.times = StepTimes()
        self._clock = StepClock(on_gpu=config.on_gpu, device_clock=config.device_clock)
        self._early = EarlyUpdate(self)
        self._step_settings: list[AdamSettings] = []
        self.ferry: WeightFerry | None = None
        self._clip: clipping.ClipInUpdate | None = None
        if config.streamed and self._on_tier:  # every block in HBM: nothing streams
            norms = GradNorms(self.device)
            self.ferry = WeightFerry(
                self._on_tier, engine, self.device, lookahead=config.lookahead,
                before_copy=self._before_copy, host_alloc=self._gradient_memory,
                on_home=self._early.sent_home if config.update_in_backward else None,
                norms=norms, adder=functools.partial(CpuAdam, cpus),
            )  # fmt: skip
            # clipping reads the norms taken as the gradients left, and its coefficient
            # is applied in the update: no pass over the gradients on the tier
            self._clip = clipping.ClipInUpdate(self._on_tier, norms)
            clipping.install(self._clip)
        self._hooks = self._add_hooks(model)
        self._split = SplitKeeper(self._on_tier, config, self._cpu, self._gpu,
                                  in_hbm=[B.index for B in self._in_hbm])  # fmt: skip
        self.optimizer = optimizer_class()(self, groups, dict(base.defaults))

    @property
    def device(self) -> Any:
        """The torch device the model trains on (the configuration's)."""
        return self.config.device

    @property
    def weights(self) -> Weights:
        """Where the blocks' weights live: "resident" on the device, or "stream"."""
        return self.config.weights

    # --- set-up ------------------------------------------------------------------------
    def _gradient_memory(self, B: Block) -> Any:
        """More host memory like the block's gradients, on the tier (WeightFerry's, for
        a later micro-batch)."""
        return self._host_alloc(B.numel * B.dtype.itemsize, self.config.on_gpu).view(B.dtype)

    def _add_hooks(self, model: Any) -> list[Any]:
        """Resident blocks (streamed: those in HBM): each one's forward pass waits for its
        update (overlapped); resident, their gradients begin their update (in the
        backward pass); the model's state hooks."""
        hooks = []
        resident = not self.config.streamed
        if self.config.overlaps:
            for B in self._in_hbm if self.config.streamed else self._blocks:
                hooks.append(B.module.register_forward_pre_hook(self._forward_waiter(B)))
        if self.config.update_in_backward and resident:
            for B in self._blocks:
                for p in B.params:
                    hooks.append(p.param.register_post_accumulate_grad_hook(
                        functools.partial(self._early.gradient_arrived, B)))  # fmt: skip
        hooks.append(model.register_state_dict_pre_hook(self._before_model_state))
        hooks.append(model.register_load_state_dict_pre_hook(self._before_model_load))
        hooks.append(model.register_load_state_dict_post_hook(self._after_model_load))
        return hooks

    @property
    def update_begins_in_backward(self) -> bool:
        """Whether the next step's update begins in its backward pass: with
        ``update_in_backward=True``, once a step() has shown the loop, and while the loop
        leaves the gradients as the backward pass made them (a clip or GradScaler's
        unscaling changes them: the update waits for step(), which gives it them).
        Streamed, a last micro-batch's gradients are added to the earlier ones' on the
        tier by a thread of their own: with accumulation the update waits for step()."""
        habit = self._early.habit
        known = habit.passes == 1 or (habit.passes > 1 and not self.config.streamed)
        return self.config.update_in_backward and known and not habit.touches

    # --- the split ------------------------------------------------------------------
    def plan(self) -> UpdateSplit:
        """Which blocks are updated on the CPU and which on the GPU (their state on the
        tier, or in HBM), and why."""
        in_hbm = tuple(B.index for B in self._in_hbm)
        return dataclasses.replace(self._split.current, hbm=in_hbm)

    def set_plan(self, *, gpu: Iterable[int], gpu_early: Iterable[int] = ()) -> UpdateSplit:
        """Update the blocks ``gpu`` on the GPU and the rest on the CPU, from now on
        (the timings no longer move the split); ``gpu_early``: those of ``gpu`` whose
        update begins in the backward pass, as their gradients arrive (with
        ``update_in_backward=True`` and the weights resident)."""
        chosen, early = self._split.checked(gpu, gpu_early)
        self.synchronize()
        return self._split.fix(chosen, early)

    # --- waiting for a block's update ----------------------------------------------------
    def _wait_for(self, B: Block, stream: Any) -> None:
        """Until ``B``'s last update is done: the host for its CPU step (an error of the
        step is raised here), ``stream`` for the copy or GPU update of its weights."""
        pending = B.flight.cpu_update
        if pending is not None:
            pending.result()
        if self.config.on_gpu:
            self.engine.wait(stream, B.flight.updated)

    def _forward_waiter(self, B: Block) -> Callable[..., None]:
        torch = import_torch()

        def before_forward(module: Any, args: Any) -> None:
            self._wait_for(B, torch.cuda.current_stream(self.device))

        waiter: Callable[..., None] = torch.compiler.disable(before_forward)
        return waiter  # a compiled model calls it as it is

    def _before_copy(self, position: int) -> None:
        """Streamed: before the ring copies a block's home weights to the device
        (``position`` in the ring's blocks, those on the tier)."""
        self._wait_for(self._on_tier[position], self.engine.copy_in_stream)

    # --- the step ----------------------------------------------------------------------
    def _settle(self) -> None:
        """The last step's update, finished: its CPU side waited for (its error raised),
        both sides' times taken, and the split refined from them."""
        for B in self._blocks:
            if B.flight.cpu_update is not None:
                B.flight.cpu_update.result()
                B.flight.cpu_update = None
        if not self._stepped:
            return
        self._clock.read(self._cpu, self._gpu, self.times)
        self._split.refine(self.times)

    def _begin(self) -> None:
        """This step's update begins (at step(), or in the backward pass): the last
        one's finished, and the settings of what begins in the backward pass taken."""
        if self._early.begun:
            return
        self._settle()
        self._step_settings = AdamSettings.now(self.optimizer.param_groups, self._decoupled)
        self._stepped = True
        self._cpu.first = self._cpu.end = 0.0
        torch = import_torch()
        here = torch.cuda.current_stream(self.device) if self.config.on_gpu else None
        self._clock.begin(self.engine, here)  # where autograd (or the loop) has got to
        self._early.begun = True

    def _step(self, groups: list[dict[str, Any]]) -> None:
        torch = import_torch()
        begun_in_backward = self._early.begun
        self._begin()
        # what was begun in the backward pass took the settings of then; the rest, now's
        settings = (
            AdamSettings.now(groups, self._decoupled) if begun_in_backward else self._step_settings
        )
        self._early.check(settings, self._step_settings)
        clipped = self._clip is not None and self._clip.pending
        if clipped:
            self._early.refuse_clipped()
        self._early.learn(clipped=clipped)  # for the next step's backward pass
        scales = self._clip.take() if self._clip is not None else {}
        early = self._early.take()
        by_index = {B.index: B for B in self._blocks}
        # decided here: the user may clear the gradients while the update runs; each
        # parameter with one takes a step (its own count, as torch's Adam keeps it)
        live = {
            B.index: [] if B.index in early else [p for p in B.params if p.param.grad is not None]
            for B in self._blocks
        }
        for B in self._blocks:
            self._adam_steps.advance(p.param for p in live[B.index])
        if self.ferry is not None:
            for B in self._on_tier:
                self.ferry.adopt_grads(B, live[B.index])
        cpu_blocks = [by_index[i] for i in self._split.current.cpu if live[i]]
        gpu_blocks = [by_index[i] for i in self._split.current.gpu if live[i]]
        if self.ferry is not None:
            # the blocks updated in the backward pass too: their device copies are free now
            for B in cpu_blocks + gpu_blocks + [by_index[i] for i in sorted(early)]:
                self.ferry.invalidate(B)

        def settings_of(B: Block) -> list[AdamSettings]:  # a clip's coefficient in them
            scale = scales.get(B.index, 1.0)
            return settings if scale == 1.0 else [dataclasses.replace(s, grad_scale=scale)
                                                  for s in settings]  # fmt: skip

        if self._gpu is None:
            self._clock.step_called_on(None, from_backward=begun_in_backward)
            for B in cpu_blocks:
                self._cpu.block(B, live[B.index], settings_of(B))
            self._rest.step(settings, self._cpu.adam)
            return
        current = torch.cuda.current_stream(self.device)
        self._clock.step_called_on(current, from_backward=begun_in_backward)
        self._cpu.forward_order()  # every gradient is in: the forward pass's order
        if self.ferry is None:
            self._cpu.grads_out(cpu_blocks, live, current)
        produced = self._record(current)  # the backward pass's gradients
        for B in cpu_blocks:
            self._cpu.submit(B, live[B.index], settings_of(B))
        in_hbm = [B for B in self._in_hbm if live[B.index]]
        for blocks in _by_scale(in_hbm, scales):  # first: the next forward pass needs them first
            self._gpu.update_in_hbm(blocks, live, produced, settings_of(blocks[0]))
        for blocks in _by_scale(gpu_blocks, scales):
            self._gpu.update(blocks, live, produced, settings_of(blocks[0]))
        self._rest.step(settings, self._cpu.adam)
        if not self.config.overlaps:
            self.synchronize()

    def _record(self, stream: Any) -> Any:
        event = self.engine.event()
        self.engine.record(event, stream)
        return event

    # --- the update begun in the backward pass (early.py asks these) ---------------------
    def _early_gpu(self, B: Block, params: list[ParamSlot]) -> None:
        """Resident: ``B``'s GPU step, once the stream autograd runs on has made its
        gradients (the block's weights are not read again in this pass)."""
        torch = import_torch()
        assert self._gpu is not None
        self._adam_steps.advance(p.param for p in params)
        produced = self._record(torch.cuda.current_stream(self.device))
        self._gpu.update([B], {B.index: params}, produced, self._step_settings, early=True)

    def _early_cpu(self, B: Block, params: list[ParamSlot], *, copy_out: bool) -> None:
        """``B``'s CPU step, its gradients copied to the tier first (``copy_out``,
        resident on a GPU)."""
        if copy_out and self.config.on_gpu:
            current = import_torch().cuda.current_stream(self.device)
            self._cpu.grads_out([B], {B.index: params}, current)
        self._adam_steps.advance(p.param for p in params)
        self._cpu.submit_early(B, params, self._step_settings)

    def _home_grads(self, B: Block) -> list[Any]:
        assert self.ferry is not None
        return list(self.ferry.home_grads(B))

    def _forgotten(self, blocks: list[int]) -> None:
        """A step begun in the backward pass was refused: not one to plan from, and the
        streamed device copies of the blocks it updated are stale."""
        self._clock.untimed = True
        self._forget_device_copies(blocks)

    def _unstepped(self) -> None:
        if self._clip is not None:
            self._clip.clear()
        self._early.unstepped()

    # --- the model's own state ---------------------------------------------------------
    def _before_model_state(self, module: Any, prefix: str, keep_vars: bool) -> None:
        self.synchronize()  # the weights of an update in flight are not the ones saved

    def _before_model_load(self, module: Any, *args: Any) -> None:
        self.synchronize()  # an update in flight would write over what is loaded

    def _after_model_load(self, module: Any, incompatible: Any) -> None:
        """The model's weights were loaded: the masters follow them (an optimizer
        state loaded after this sets the saved fp32 masters)."""
        self.synchronize()
        saved.follow_weights(self._blocks, self._rest)
        self._forget_device_copies()

    # --- what users ask ------------------------------------------------------------------
    def host_tensors(self) -> list[Any]:
        """The host memory on the tier: each block's state, and its gradients and
        weights where they are kept there."""
        return saved.host_tensors(self._blocks)

    def pages_by_node(self) -> dict[int, int]:
        """Pages of the offload's host memory per NUMA node, counted now."""
        return pages_of(self.host_tensors())

    def master_weights(self, param: Any) -> Any:
        """The fp32 master copy of a block's parameter (a view of the tier's memory)."""
        self.synchronize()
        return saved.master_of(self._blocks, self._rest, param)

    def save(self, folder: str | os.PathLike[str]) -> Path:
        """The model's weights and the optimizer's state into ``folder``, one tensor at a
        time from where each lives (nothing copied whole: saving.py): a checkpoint
        ``from_pretrained`` and ``offload_model(weights_from=folder)`` read, with the
        optimizer's state beside it for ``load``. The scheduler's state is the
        scheduler's own (``scheduler.state_dict()``)."""
        self._check_open()
        self.synchronize()
        groups = self.optimizer.param_groups
        entries = saved.entries(self._blocks, self._rest)
        return saving.save(folder, self.model, self._blocks, entries, self._adam_steps, groups)

    def load(self, folder: str | os.PathLike[str]) -> None:
        """The weights and the optimizer's state ``save`` wrote into ``folder``, read
        into where each lives, one tensor at a time; every name, dtype and shape
        checked before anything changes."""
        self._check_open()
        found = saving.Saved(folder)
        self.synchronize()
        groups = self.optimizer.param_groups
        entries = saved.entries(self._blocks, self._rest)
        saving.load(found, self.model, entries, self._adam_steps, groups)
        self._forget_device_copies()

    def _state_dict(self, base: dict[str, Any]) -> dict[str, Any]:
        """The optimizer's state as torch's Adam saves it (state.py)."""
        self.synchronize()
        groups = self.optimizer.param_groups
        return saved.state_dict(self._blocks, self._rest, self._adam_steps, groups, base)

    def _load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = self.optimizer.param_groups
        loaded = saved.checked(self._blocks, self._rest, groups, state_dict)
        self.synchronize()
        saved.load(loaded, self._adam_steps)
        self._forget_device_copies()

    def _forget_device_copies(self, blocks: Iterable[int] | None = None) -> None:
        """Streamed: the device copies of ``blocks`` (all by default) are stale."""
        if self.ferry is not None:
            in_hbm = {id(B) for B in self._in_hbm}
            chosen = self._on_tier if blocks is None else [self._blocks[i] for i in blocks]
            for B in chosen:
                if id(B) not in in_hbm:
                    self.ferry.invalidate(B)

    def synchronize(self) -> None:
        """Wait for the update in flight: every block's step, every copy."""
        for B in self._blocks:
            if B.flight.cpu_update is not None:
                B.flight.cpu_update.result()
        if self.config.on_gpu:
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
        if self._clip is not None:
            clipping.remove(self._clip)
        if self.ferry is not None:
            self.ferry.close()
        self._cpu.close()
        if self._gpu is not None:
            self._gpu.free()


def _by_scale(blocks: list[Block], scales: dict[int, float]) -> list[list[Block]]:
    """``blocks`` in runs that share a clip's coefficient (one call of a side each)."""
    runs: dict[float, list[Block]] = {}
    for B in blocks:
        runs.setdefault(scales.get(B.index, 1.0), []).append(B)
    return list(runs.values())
