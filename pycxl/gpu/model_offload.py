"""A whole model trained with its optimizer state on a memory tier: the blocks' fp32
master weights and Adam moments live on the tier, and each block's update runs where it
is fastest.

``ModelOffload(model, ...)`` finds the model's repeated blocks (a Hugging Face model's
decoder layers: the largest ``ModuleList`` of modules of one type), keeps their
parameters where they are (on the GPU, in the model's precision) and moves their
optimizer state onto the tier. ``offload.optimizer`` is a ``torch.optim.Optimizer``:
gradients accumulate in ``param.grad`` as in plain PyTorch, so gradient accumulation,
clipping by global norm, GradScaler, learning-rate schedulers and activation
checkpointing see an ordinary model. Its ``step()`` updates:

- each block planned for the GPU: its state is copied from the tier (pinned) into one of
  three device buffers, updated there by PyTorch's fused CUDA Adam and copied back, the
  copies of the next and the last block running beside the update (the link carries both
  directions at once);
- each block planned for the CPU: its gradients are copied to the tier, the fused CPU
  step of native/adam.c updates master and moments in one pass and writes the weights in
  the model's precision, which are copied back to the GPU;
- the rest of the model (embeddings, norm, head): fp32 masters and moments in HBM,
  PyTorch's fused CUDA Adam.

Both sides run at once; the plan splits the blocks so that they finish together, from
rates measured on this host at set-up (the CPU step over the tier's memory; the link
both ways) and refined from the first steps' timings. ``plan()`` shows it and why;
``set_plan(gpu=[...])`` fixes it. Without a GPU every block is updated on the CPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import InvalidRequestError
from .adam_step import AdamSettings, CpuAdam, gpu_adam_step
from .torch_offload import HostAlloc, import_torch

Side = Literal["cpu", "gpu"]
ALIGN_ELEMENTS = 64  # 256 bytes of fp32: each parameter's state starts aligned
GPU_SLOTS = 3  # copy in, update, copy out
REFINE_STEPS = 3  # steps whose timings adjust the split
BALANCED = 0.1  # sides within 10% of each other: the split stays


def find_blocks(model: Any) -> list[Any]:
    """The model's repeated blocks: the ``ModuleList`` holding the most parameters whose
    entries are all of one type (a transformer's layers)."""
    torch = import_torch()
    best: list[Any] = []
    best_size = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) < 2:
            continue
        kinds = {type(m) for m in module}
        size = sum(p.numel() for p in module.parameters())
        if len(kinds) == 1 and size > best_size:
            best, best_size = list(module), size
    if not best:
        raise InvalidRequestError(
            f"{type(model).__name__} has no list of repeated blocks (a ModuleList of "
            "layers of one type): pass the blocks yourself (blocks=model.layers)"
        )
    return best


@dataclass
class _Param:
    """One trainable parameter and where its state sits in its block's flat state."""

    param: Any
    group: int  # index into the optimizer's param_groups
    offset: int  # in elements
    numel: int


@dataclass
class _Block:
    index: int
    params: list[_Param]
    numel: int  # elements of the flat state, alignment included
    dtype: Any
    state: Any = None  # fp32 host tensor [master | exp_avg | exp_avg_sq], on the tier
    grads: Any = None  # host tensor of the params' dtype (a GPU's CPU-side updates)
    weights: Any = None  # host tensor: the CPU step's new weights, copied to the GPU
    grads_landed: Any = None  # event: the gradients are in host memory

    def part(self, flat: Any, which: int, p: _Param) -> Any:
        """``p``'s piece of region ``which`` (0 master, 1 exp_avg, 2 exp_avg_sq, 3 a
        GPU's fp32 gradient) of a flat fp32 tensor laid out like ``state``."""
        at = which * self.numel + p.offset
        return flat[at : at + p.numel]


@dataclass(frozen=True)
class UpdatePlan:
    """Which blocks are updated where, and the rates that chose it (parameters per
    second: the CPU step over the tier's memory, the GPU's over state streamed both
    ways), with the update time they predict."""

    cpu: tuple[int, ...]
    gpu: tuple[int, ...]
    cpu_rate: float | None
    gpu_rate: float | None
    predicted_s: float | None
    why: str

    def __str__(self) -> str:
        def rate(r: float | None) -> str:
            return "not measured" if r is None else f"{r / 1e9:.2f} G parameters/s"

        lines = [
            f"CPU: blocks {_ranges(self.cpu) or 'none'} ({rate(self.cpu_rate)})",
            f"GPU: blocks {_ranges(self.gpu) or 'none'} ({rate(self.gpu_rate)})",
        ]
        if self.predicted_s is not None:
            lines.append(f"update predicted {self.predicted_s * 1e3:.0f} ms: {self.why}")
        else:
            lines.append(self.why)
        return "\n".join(lines)


def _ranges(ids: Sequence[int]) -> str:
    from ..values import format_ranges

    return format_ranges(list(ids))


@dataclass
class StepTimes:
    """The last step's update: seconds on each side (the CPU's from its first block to
    its last weight copied; the GPU's from the first copy in to the last copy out)."""

    cpu_s: float = 0.0
    gpu_s: float = 0.0
    total_s: float = 0.0
    steps: int = 0
    history: list[tuple[float, float]] = field(default_factory=list)


def split(
    sizes: Mapping[int, int], cpu_rate: float, gpu_rate: float
) -> tuple[list[int], list[int]]:
    """Blocks (index -> parameters) for each side, in index order, each block to the
    side that would finish it first: both sides end together and early blocks (the next
    forward pass's first) are spread over both."""
    cpu: list[int] = []
    gpu: list[int] = []
    t_cpu = t_gpu = 0.0
    for index, n in sorted(sizes.items()):
        if t_cpu + n / cpu_rate <= t_gpu + n / gpu_rate:
            cpu.append(index)
            t_cpu += n / cpu_rate
        else:
            gpu.append(index)
            t_gpu += n / gpu_rate
    return cpu, gpu


def _optimizer_class() -> type:
    """``TierOptimizer``: a torch.optim.Optimizer (schedulers and GradScaler take it)
    whose step is the offload's."""
    torch = import_torch()

    class TierOptimizer(torch.optim.Optimizer):  # type: ignore[misc,name-defined]
        """Adam or AdamW over a model whose blocks' state is on a tier: ``step()``
        updates every parameter (see pycxl.gpu.model_offload); ``param_groups`` are the
        ones given, so a scheduler's learning rate is the one used."""

        def __init__(
            self, offload: ModelOffload, groups: list[dict[str, Any]], defaults: dict[str, Any]
        ) -> None:
            super().__init__(groups, defaults)
            self._offload = offload

        def step(self, closure: Callable[[], Any] | None = None) -> Any:
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            self._offload._step(self.param_groups)
            return loss

        def state_dict(self) -> dict[str, Any]:
            return self._offload._state_dict(super().state_dict())

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self._offload._load_state_dict(state_dict)
            groups = state_dict["param_groups"]
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
        update: Literal["auto", "cpu", "gpu"] = "auto",
    ) -> None:
        torch = import_torch()
        if update not in ("auto", "cpu", "gpu"):
            raise InvalidRequestError(f"update {update!r}: give 'auto', 'cpu' or 'gpu'")
        self.device = torch.device(device)
        self._on_gpu = self.device.type == "cuda"
        if update == "gpu" and not self._on_gpu:
            raise InvalidRequestError("update='gpu' needs a GPU: name one, or use 'cpu'")
        self.model = model
        self.engine = engine
        self._host_alloc = host_alloc
        modules = list(blocks) if blocks is not None else find_blocks(model)
        base = (
            optimizer(list(model.parameters()))
            if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer)
            else optimizer
        )
        self._group_of, groups = self._groups(model, base)
        self._settings_class_decoupled = isinstance(base, torch.optim.AdamW)
        self._blocks = self._layout(modules)
        in_blocks = {id(p.param) for B in self._blocks for p in B.params}
        self._rest = [p for p in model.parameters() if p.requires_grad and id(p) not in in_blocks]
        self._steps = 0
        self._place_state()
        self._rest_state = self._place_rest()
        self._cpu = CpuAdam(cpus)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="pycxl-cpu-adam")
        self._lock = threading.Lock()
        self.times = StepTimes()
        self._slots: list[Any] = []
        self._in_flight: list[Any] = []
        self._gpu_views: dict[tuple[int, int], Any] = {}
        if self._on_gpu:
            largest = max(B.numel for B in self._blocks)
            self._slots = [
                torch.empty(4 * largest, dtype=torch.float32, device=self.device)
                for _ in range(GPU_SLOTS)
            ]
            self._update_stream = torch.cuda.Stream(self.device)
            self._events = {
                name: [engine.event() for _ in range(GPU_SLOTS)]
                for name in ("loaded", "updated", "free")
            }
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

    def _layout(self, modules: list[Any]) -> list[_Block]:
        out = []
        seen: set[int] = set()
        for i, module in enumerate(modules):
            params = [p for p in module.parameters() if p.requires_grad and id(p) not in seen]
            seen.update(id(p) for p in params)
            dtypes = {p.dtype for p in params}
            if len(dtypes) > 1:
                raise InvalidRequestError(
                    f"block {i} mixes parameter dtypes {sorted(map(str, dtypes))}: give its "
                    "parameters one dtype (model.to(torch.bfloat16))"
                )
            at, placed = 0, []
            for p in params:
                placed.append(_Param(p, self._group_of[id(p)], at, p.numel()))
                at += -(-p.numel() // ALIGN_ELEMENTS) * ALIGN_ELEMENTS
            if params and any(p.device != self.device for p in params):
                raise InvalidRequestError(
                    f"block {i}'s parameters are on {params[0].device}, not {self.device}: "
                    "move the model there first (model.to(device))"
                )
            out.append(_Block(i, placed, at, params[0].dtype if params else None))
        blocks = [B for B in out if B.params]
        if not blocks:
            raise InvalidRequestError("the blocks have no trainable parameters")
        return blocks

    def _place_state(self) -> None:
        torch = import_torch()
        for B in self._blocks:
            flat = self._host_alloc(3 * B.numel * 4, self._on_gpu).view(torch.float32)
            flat.zero_()
            with torch.no_grad():
                for p in B.params:
                    B.part(flat, 0, p).copy_(p.param.detach().reshape(-1))
            B.state = flat
            if self._on_gpu:
                size = B.numel * B.dtype.itemsize
                B.grads = self._host_alloc(size, True).view(B.dtype)
                B.weights = self._host_alloc(size, True).view(B.dtype)
                B.grads_landed = self.engine.event()

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
    def _first_plan(self, update: str) -> UpdatePlan:
        everything = tuple(B.index for B in self._blocks)
        if not self._on_gpu:
            return UpdatePlan(everything, (), None, None, None, "no GPU: the CPU updates all")
        if update == "cpu":
            return UpdatePlan(everything, (), None, None, None, "fixed: update='cpu'")
        if update == "gpu":
            return UpdatePlan((), everything, None, None, None, "fixed: update='gpu'")
        cpu_rate, gpu_rate = self._measure_rates()
        return self._split(cpu_rate, gpu_rate, "rates measured at set-up")

    def _split(self, cpu_rate: float, gpu_rate: float, why: str) -> UpdatePlan:
        sizes = {B.index: B.numel for B in self._blocks}
        cpu, gpu = split(sizes, cpu_rate, gpu_rate)
        predicted = max(
            sum(sizes[i] for i in cpu) / cpu_rate, sum(sizes[i] for i in gpu) / gpu_rate
        )
        return UpdatePlan(tuple(cpu), tuple(gpu), cpu_rate, gpu_rate, predicted, why)

    def _measure_rates(self) -> tuple[float, float]:
        """Parameters per second of each side, on the largest block: the CPU step with a
        zero learning rate and zero gradients (no state changes), and the state's copy
        to the device beside its copy back (both directions at once, as in a step)."""
        from .streams import Event

        B = max(self._blocks, key=lambda b: b.numel)
        settings = AdamSettings(0.0, (0.9, 0.999), 1e-8, 0.0, True, False)
        grads = B.grads.zero_()
        cpu_s = gpu_s = float("inf")
        for _ in range(2):  # the first warms caches and page tables
            t0 = time.perf_counter()
            for p in B.params:
                self._cpu_step(B, p, _piece(grads, p), 1, settings, weight=_piece(B.weights, p))
            cpu_s = min(cpu_s, time.perf_counter() - t0)
        eng = self.engine
        nbytes = 3 * B.numel * 4
        host = eng.host_span(B.state)
        into, out_of = (self._slots[0].data_ptr(), nbytes), (self._slots[1].data_ptr(), nbytes)
        eng.copy_in(out_of, host)  # what goes back is what is there: the state is unchanged
        start, end_in, end_out = Event(), Event(), Event()
        for _ in range(2):
            start.record(_stream(eng.copy_in_stream))
            eng.wait(eng.copy_out_stream, start)
            eng.copy_in(into, host)
            eng.copy_out(host, out_of)
            end_in.record(_stream(eng.copy_in_stream))
            end_out.record(_stream(eng.copy_out_stream))
            end_in.synchronize()
            end_out.synchronize()
            gpu_s = min(gpu_s, max(end_in.ms_since(start), end_out.ms_since(start)) / 1e3)
        return B.numel / cpu_s, B.numel / gpu_s

    def _record(self, stream: Any) -> Any:
        event = self.engine.event()
        self.engine.record(event, stream)
        return event

    def plan(self) -> UpdatePlan:
        """Which blocks are updated on the CPU and which on the GPU, and why."""
        return self._plan

    def set_plan(self, *, gpu: Iterable[int]) -> UpdatePlan:
        """Update the blocks ``gpu`` on the GPU and the rest on the CPU, from now on
        (the timings no longer move the split)."""
        chosen = sorted(set(gpu))
        known = {B.index for B in self._blocks}
        bad = [i for i in chosen if i not in known]
        if bad:
            raise InvalidRequestError(
                f"blocks {bad}: this model's blocks are {_ranges(sorted(known))}"
            )
        if chosen and not self._on_gpu:
            raise InvalidRequestError("no GPU to update blocks on: the CPU updates them all")
        cpu = tuple(i for i in sorted(known) if i not in chosen)
        self._fixed = True
        self._plan = UpdatePlan(
            cpu, tuple(chosen), self._plan.cpu_rate, self._plan.gpu_rate, None, "fixed by set_plan"
        )
        return self._plan

    def _refine(self) -> None:
        """After a step: when one side took more than BALANCED longer than the other,
        split again by the rates the step showed."""
        t = self.times
        if self._fixed or not self._on_gpu or t.steps > REFINE_STEPS or not t.cpu_s or not t.gpu_s:
            return
        if not self._plan.cpu or not self._plan.gpu:  # a side without blocks shows no rate
            return
        if abs(t.cpu_s - t.gpu_s) <= BALANCED * max(t.cpu_s, t.gpu_s):
            return
        sizes = {B.index: B.numel for B in self._blocks}
        cpu_rate = sum(sizes[i] for i in self._plan.cpu) / t.cpu_s
        gpu_rate = sum(sizes[i] for i in self._plan.gpu) / t.gpu_s
        self._plan = self._split(cpu_rate, gpu_rate, f"rates of step {t.steps}")

    # --- the step ----------------------------------------------------------------------
    def _settings(self, groups: list[dict[str, Any]]) -> list[AdamSettings]:
        decoupled = self._settings_class_decoupled
        out = []
        for g in groups:
            lr = g["lr"]
            lr = float(lr.item()) if hasattr(lr, "item") else float(lr)
            out.append(AdamSettings.from_group(g, lr=lr, decoupled=decoupled))
        return out

    def _step(self, groups: list[dict[str, Any]]) -> None:
        torch = import_torch()
        settings = self._settings(groups)
        self._steps += 1
        step = self._steps
        t0 = time.perf_counter()
        by_index = {B.index: B for B in self._blocks}
        cpu_blocks = [by_index[i] for i in self._plan.cpu if _has_grads(by_index[i])]
        gpu_blocks = [by_index[i] for i in self._plan.gpu if _has_grads(by_index[i])]
        if not self._on_gpu:
            for B in cpu_blocks:
                for p in B.params:
                    if p.param.grad is not None:
                        self._cpu_step(
                            B, p, _grad_of(p), step, settings[p.group], weight=p.param.data.view(-1)
                        )
            self.times.cpu_s = time.perf_counter() - t0
        else:
            from .streams import Event

            current = torch.cuda.current_stream(self.device)
            produced = self._record(current)  # the backward pass's gradients
            self._copy_grads_out(cpu_blocks, produced)
            cpu_done: Future[float] = self._worker.submit(
                self._cpu_side, cpu_blocks, step, settings
            )
            start, end = Event(), Event()
            start.record(_stream(self.engine.copy_in_stream))
            self._gpu_side(gpu_blocks, produced, step, settings)
            end.record(_stream(self.engine.copy_out_stream))
            self._rest_step(settings, step)
            cpu_s = cpu_done.result()  # re-raises an error of the CPU side
            self.engine.wait(current, self._record(self.engine.copy_in_stream))
            current.wait_stream(self._update_stream)
            end.synchronize()
            self.times.cpu_s, self.times.gpu_s = (
                cpu_s,
                end.ms_since(start) / 1e3 if gpu_blocks else 0.0,
            )
        if not self._on_gpu:
            self._rest_step(settings, step)
        self.times.total_s = time.perf_counter() - t0
        self.times.steps += 1
        self.times.history.append((self.times.cpu_s, self.times.gpu_s))
        self._refine()

    def _copy_grads_out(self, blocks: list[_Block], produced: Any) -> None:
        eng = self.engine
        eng.wait(eng.copy_out_stream, produced)
        self._in_flight = []  # gradients made contiguous for the copy live until the step ends
        for B in blocks:
            base, _ = eng.host_span(B.grads)
            size = B.dtype.itemsize
            for p in B.params:
                g = _grad_of(p)
                self._in_flight.append(g)
                eng.copy_out(
                    (base + p.offset * size, p.numel * size), (g.data_ptr(), p.numel * size)
                )
            eng.record(B.grads_landed, eng.copy_out_stream)

    def _cpu_side(self, blocks: list[_Block], step: int, settings: list[AdamSettings]) -> float:
        """The CPU's blocks (worker thread): wait for each one's gradients, step it,
        copy its weights to the GPU. Returns the seconds it took."""
        eng = self.engine
        t0 = time.perf_counter()
        for B in blocks:
            eng.synchronize(B.grads_landed)
            base, _ = eng.host_span(B.weights)
            size = B.dtype.itemsize
            for p in B.params:
                if p.param.grad is None:
                    continue
                self._cpu_step(
                    B, p, _piece(B.grads, p), step, settings[p.group], weight=_piece(B.weights, p)
                )
                eng.copy_in(
                    (p.param.data_ptr(), p.numel * size), (base + p.offset * size, p.numel * size)
                )
        return time.perf_counter() - t0

    def _cpu_step(
        self,
        B: _Block,
        p: _Param,
        grad: Any,
        step: int,
        settings: AdamSettings,
        weight: Any | None = None,
    ) -> None:
        state = (B.part(B.state, 0, p), B.part(B.state, 1, p), B.part(B.state, 2, p))
        self._cpu.step(state, grad, weight, step, settings)

    def _gpu_side(
        self, blocks: list[_Block], produced: Any, step: int, settings: list[AdamSettings]
    ) -> None:
        """Enqueue the GPU's blocks: state in, fused update, state out, through the
        three device buffers; the host does not wait."""
        torch = import_torch()
        eng = self.engine
        ev = self._events
        upd = self._update_stream
        eng.wait(upd, produced)
        step_t = torch.full((), float(step), dtype=torch.float32, device=self.device)
        for j, B in enumerate(blocks):
            s = j % GPU_SLOTS
            slot = self._slots[s]
            nbytes = 3 * B.numel * 4
            eng.wait(eng.copy_in_stream, ev["free"][s])
            eng.copy_in((slot.data_ptr(), nbytes), eng.host_span(B.state))
            eng.record(ev["loaded"][s], eng.copy_in_stream)
            eng.wait(upd, ev["loaded"][s])
            with torch.cuda.stream(upd):
                by_group: dict[int, list[_Param]] = {}
                for p in B.params:
                    if p.param.grad is not None:
                        by_group.setdefault(p.group, []).append(p)
                for g, params in by_group.items():
                    grads = [B.part(slot, 3, p) for p in params]
                    for g32, p in zip(grads, params, strict=True):
                        g32.copy_(_grad_of(p))
                    masters = [B.part(slot, 0, p) for p in params]
                    gpu_adam_step(
                        masters,
                        grads,
                        [B.part(slot, 1, p) for p in params],
                        [B.part(slot, 2, p) for p in params],
                        step_t,
                        settings[g],
                    )
                    for m, p in zip(masters, params, strict=True):
                        p.param.data.view(-1).copy_(m)
            eng.record(ev["updated"][s], upd)
            eng.wait(eng.copy_out_stream, ev["updated"][s])
            eng.copy_out(eng.host_span(B.state), (slot.data_ptr(), nbytes))
            eng.record(ev["free"][s], eng.copy_out_stream)
        step_t.record_stream(upd)

    def _rest_step(self, settings: list[AdamSettings], step: int) -> None:
        """The parameters outside the blocks, in the device's memory."""
        torch = import_torch()
        live = [(p, m, a, b) for p, m, a, b in self._rest_state if p.grad is not None]
        if not live:
            return
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
                    step,
                    settings[self._group_of[id(p)]],
                )
            return
        step_t = torch.full((), float(step), dtype=torch.float32, device=self.device)
        by_group: dict[int, list[tuple[Any, Any, Any, Any]]] = {}
        for entry in live:
            by_group.setdefault(self._group_of[id(entry[0])], []).append(entry)
        for g, entries in by_group.items():
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

    # --- what users ask ------------------------------------------------------------------
    def host_tensors(self) -> list[Any]:
        """The host memory on the tier: each block's state (and its gradient and weight
        buffers on a GPU)."""
        out = []
        for B in self._blocks:
            out += [t for t in (B.state, B.grads, B.weights) if t is not None]
        return out

    def pages_by_node(self) -> dict[int, int]:
        """Pages of the offload's host memory per NUMA node, counted now."""
        from collections import Counter

        from ..numa.pages import pages_by_node

        total: Counter[int] = Counter()
        for t in self.host_tensors():
            total.update(pages_by_node(t))
        return dict(sorted(total.items()))

    def master_weights(self, param: Any) -> Any:
        """The fp32 master copy of a block's parameter (a view of the tier's memory)."""
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
                out.append(
                    (p.param, *(B.part(B.state, k, p).view(p.param.shape) for k in range(3)))
                )
        return out + list(self._rest_state)

    def _state_dict(self, base: dict[str, Any]) -> dict[str, Any]:
        """The optimizer's state as torch's Adam saves it (by parameter index, fp32
        tensors copied off the tier), with each parameter's fp32 master beside it."""
        index = {
            id(p): i
            for i, p in enumerate(p for g in self.optimizer.param_groups for p in g["params"])
        }
        state = {}
        torch = import_torch()
        for p, master, a, b in self._entries():
            state[index[id(p)]] = {
                "step": torch.tensor(float(self._steps)),
                "exp_avg": a.detach().cpu().clone(),
                "exp_avg_sq": b.detach().cpu().clone(),
                "master": master.detach().cpu().clone(),
            }
        return {"state": state, "param_groups": base["param_groups"]}

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
            if tuple(st["master"].shape) != tuple(p.shape):
                raise InvalidRequestError(
                    f"parameter {i}: saved shape {tuple(st['master'].shape)}, "
                    f"the model's {tuple(p.shape)}"
                )
            checked.append((entries[id(p)], st))
        self.synchronize()
        with torch.no_grad():
            for (p, master, a, b), st in checked:
                master.copy_(st["master"])
                a.copy_(st["exp_avg"])
                b.copy_(st["exp_avg_sq"])
                p.data.copy_(master.view(p.shape))
        steps = {int(st["step"]) for _, st in checked}
        self._steps = max(steps, default=0)

    def synchronize(self) -> None:
        """Wait for the update's copies in flight."""
        if self._on_gpu:
            import_torch().cuda.synchronize(self.device)

    def close(self) -> None:
        """Stop the CPU step's threads and free the device buffers."""
        self.synchronize()
        self._worker.shutdown(wait=True)
        self._cpu.close()
        self._slots = []


def _piece(flat: Any, p: _Param) -> Any:
    return flat[p.offset : p.offset + p.numel]


def _grad_of(p: _Param) -> Any:
    g = p.param.grad
    if not g.is_contiguous():
        g = g.contiguous()
    return g.view(-1)


def _has_grads(B: _Block) -> bool:
    return any(p.param.grad is not None for p in B.params)


def _stream(stream: Any) -> Any:
    from .streams import Stream

    return Stream.borrow(stream)
