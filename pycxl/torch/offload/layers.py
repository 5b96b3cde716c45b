"""PyTorch layers whose weights live on a memory tier and are streamed to the GPU as
they run, and whose optimizer state stays on the tier (the ZeRO-Offload pattern).

``LayerOffload(layers, ...)`` takes a model's layers (a sequence of modules run in
order) and:

- ``weights="stream"``: moves each layer's parameters into pinned host memory on the
  tier. A forward pre-hook gets the layer from a ``Prefetcher`` ring (the compute stream
  waits for its copy; the next layer's copy already runs behind it) and points the
  parameters at the ring's device buffer; a forward hook gives the buffer back. In
  training, a backward pre-hook gets the layer again (the ring keeps the last layers of
  the forward pass, so the turn costs no copy), and once a layer's gradients are
  accumulated they are copied back to pinned host memory on the tier and the device
  memory is let go. GPU memory holds ``lookahead + 1`` layers, never the model.
- ``weights="resident"``: the parameters stay on the device; only gradients go to the
  host and updated weights come back.
- ``optimizer`` (an Adam or AdamW factory): each layer's fp32 master weights, and the
  optimizer's moments, live on the tier (unpinned: only the CPU touches them). As soon
  as a layer's gradients have landed, a worker thread runs the optimizer step for that
  layer on the CPU (PyTorch's fused CPU Adam where it exists), while the GPU runs the
  backward pass of the layers before it; the new weights are copied back before the
  layer runs again.

On the CPU (``device`` "cpu", a machine without a GPU) the parameters themselves move
onto the tier and the optimizer updates them there, in place.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from ...errors import InvalidRequestError
from ...gpu.engine import CopyBack, Engine, copy_to_device, copy_to_host
from ...gpu.host_engine import HostEngine
from ...gpu.prefetch import Prefetcher
from .._import import import_torch

Weights = Literal["stream", "resident"]
# (bytes, pinned) -> a uint8 CPU tensor on the tier; pinned ones are registered with the GPU
HostAlloc = Callable[[int, bool], Any]
ALIGN = 256


def tier_allocator(
    nodes: Sequence[int], ctx: Any = None, huge: Any = "auto", *, room_checked: bool = False
) -> HostAlloc:
    """Host memory on ``nodes`` for LayerOffload, as uint8 CPU tensors: pinned ones
    registered with the GPU of ``ctx`` (a GpuContext) and checked to be on the nodes
    still after the pin; others only placed. Each allocation is refused where the nodes
    lack the room, unless the caller checked the whole of it already (``room_checked``:
    a measurement's ``Pair.check_fits``). The allocator keeps the registrations alive as
    long as it lives (LayerOffload keeps it)."""
    from ...numa.placement import NumaBuffer, allocate
    from ...numa.policy import Policy

    torch = import_torch()
    owners: list[Any] = []

    def place(nbytes: int) -> Any:
        if room_checked:
            return NumaBuffer(nbytes, Policy.bind(*nodes), huge=huge)
        return allocate(nbytes, list(nodes), huge=huge)

    def host_alloc(nbytes: int, pinned: bool) -> Any:
        if pinned:
            if ctx is None:
                raise InvalidRequestError("pinned host memory needs a GPU to pin it for")
            from ...gpu.memory import HostMemory

            mem = HostMemory.owning(ctx, place(nbytes))
            owners.append(mem)
            return torch.from_numpy(mem.array("uint8"))
        return torch.from_numpy(place(nbytes).array("uint8"))

    return host_alloc


def ring_tensor(view: Any, device: Any) -> Any:
    """A ring buffer the Prefetcher handed out (a DeviceView, or a HostView on the CPU)
    as a flat uint8 tensor on ``device``, without a copy."""
    torch = import_torch()
    if torch.device(device).type == "cuda":
        return torch.as_tensor(view, device=device)
    return torch.frombuffer(view.memory, dtype=torch.uint8)


def default_optimizer(params: list[Any]) -> Any:
    """Adam (lr 1e-3), fused on the CPU where this PyTorch has it."""
    torch = import_torch()
    try:
        return torch.optim.Adam(params, lr=1e-3, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=1e-3, foreach=True)


@dataclass
class _Layer:
    """One layer's parameters and their host memory on the tier."""

    index: int
    params: list[Any]
    shapes: list[Any]  # the parameters' shapes and dtypes (streamed ones hold no data)
    dtypes: list[Any]
    offsets: list[int]
    nbytes: int
    weights: Any = None  # uint8 host tensor: the parameters, in their dtype (pinned on GPUs)
    grads: Any = None  # uint8 host tensor: gradients, in the parameters' dtype (pinned)
    masters: list[Any] = field(default_factory=list)  # fp32 copies the optimizer updates
    master_grads: list[Any] = field(default_factory=list)
    optimizer: Any = None
    update: Future[None] | None = None  # the optimizer step in flight
    updated: Any = None  # device event: the new weights are on the device (resident)
    trainable: list[int] = field(default_factory=list)  # params that take gradients
    grads_ready: int = 0
    copies: list[CopyBack] = field(default_factory=list)

    def views(self, flat: Any) -> list[Any]:
        """Each parameter's view in a flat uint8 tensor laid out like ``weights``."""
        return [
            flat[o : o + _nbytes(shape, dtype)].view(dtype).view(shape)
            for shape, dtype, o in zip(self.shapes, self.dtypes, self.offsets, strict=True)
        ]


def _nbytes(shape: Any, dtype: Any) -> int:
    count = 1
    for d in shape:
        count *= d
    return count * int(dtype.itemsize)


@dataclass
class OffloadStats:
    """What one LayerOffload moved, and how long the host waited for updates."""

    bytes_to_device: int
    bytes_to_host: int
    copies_to_device: int
    reused: int
    updates: int
    update_wait_s: float


class LayerOffload:
    """``layers`` streamed from (or their optimizer state kept in) host memory given
    by ``host_alloc``; see the module's text. ``engine`` copies (a CudaEngine for a GPU,
    None for the CPU); ``device`` is where the layers compute."""

    def __init__(
        self,
        layers: Sequence[Any],
        host_alloc: HostAlloc,
        *,
        engine: Engine,
        device: Any,
        weights: Weights = "stream",
        lookahead: int = 1,
        optimizer: Callable[[list[Any]], Any] | None = None,
        cpus: Sequence[int] | None = None,
    ) -> None:
        torch = import_torch()
        self.device = torch.device(device)
        on_gpu = self.device.type == "cuda"
        if on_gpu == isinstance(engine, HostEngine):
            raise InvalidRequestError("a GPU device needs a CUDA engine, the CPU a HostEngine")
        if weights not in ("stream", "resident"):
            raise InvalidRequestError(f"weights {weights!r}: give 'stream' or 'resident'")
        modules = list(layers)
        if not modules or not all(isinstance(m, torch.nn.Module) for m in modules):
            raise InvalidRequestError("layers: give a non-empty sequence of torch.nn.Module")
        self.weights: Weights = weights
        self.engine = engine
        self._on_gpu = on_gpu
        # On the CPU, resident parameters live on the tier themselves: no copies at all
        self._params_on_tier = not on_gpu and weights == "resident"
        self._host_alloc = host_alloc
        self._layers = self._layout(modules)
        self._hooks: list[Any] = []
        self._held: list[_Layer] = []  # bound for a backward pass without gradients of their own
        self._views: dict[tuple[int, int], list[Any]] = {}  # (slot, layer) -> param views
        self._placeholders = {id(p): self._placeholder(p) for L in self._layers for p in L.params}
        self._training_order = False
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pycxl-update")
        self._lock = threading.Lock()
        self._updates = 0
        self._update_wait_s = 0.0
        self._bytes_to_host = 0
        if weights == "resident" and optimizer is None:
            raise InvalidRequestError(
                "weights='resident' keeps the layers on the device: give an optimizer "
                "to offload (or weights='stream' to stream the layers)"
            )
        self._place_host_memory(optimizer)
        # The fused CPU step (one pass: gradient in, master and moments, weight out) for
        # Adam and AdamW; PyTorch's step for what it does not run
        self._fused = None
        if cpus and optimizer is not None and self._fused_settings(self._layers[0]) is not None:
            from .adam import CpuAdam

            self._fused = CpuAdam(cpus)
        self.ring: Prefetcher | None = None
        if weights == "stream":
            self.ring = Prefetcher(
                self.engine, [L.weights for L in self._layers], lookahead=lookahead,
                before_copy=self._wait_for_update,
            )  # fmt: skip
        self._install_hooks(modules)

    # --- set-up --------------------------------------------------------------------
    def _layout(self, modules: list[Any]) -> list[_Layer]:
        seen: set[int] = set()
        out = []
        for i, module in enumerate(modules):
            params = [p for p in module.parameters() if id(p) not in seen]
            seen.update(id(p) for p in params)
            if not params:
                raise InvalidRequestError(f"layer {i} ({type(module).__name__}) has no parameters")
            offsets, at = [], 0
            for p in params:
                offsets.append(at)
                at += -(-p.numel() * p.element_size() // ALIGN) * ALIGN
            out.append(_Layer(i, params, [p.shape for p in params], [p.dtype for p in params],
                              offsets, at))  # fmt: skip
        return out

    def _placeholder(self, p: Any) -> Any:
        return import_torch().empty(0, dtype=p.dtype, device=self.device)

    def _place_host_memory(self, optimizer: Callable[[list[Any]], Any] | None) -> None:
        torch = import_torch()
        for L in self._layers:
            L.weights = self._host_alloc(L.nbytes, self._on_gpu)
            with torch.no_grad():
                for view, p in zip(L.views(L.weights), L.params, strict=True):
                    view.copy_(p.detach())
                    if self._params_on_tier:
                        p.data = view
                    elif self.weights == "stream":
                        p.data = self._placeholders[id(p)]
                    elif p.device != self.device:
                        p.data = p.data.to(self.device)
            if not self._params_on_tier:
                L.grads = self._host_alloc(L.nbytes, self._on_gpu)
            if optimizer is not None:
                self._place_optimizer(L, optimizer)

    def _place_optimizer(self, L: _Layer, factory: Callable[[list[Any]], Any]) -> None:
        torch = import_torch()
        fp32 = all(d == torch.float32 for d in L.dtypes)
        sizes = [_nbytes(shape, torch.float32) for shape in L.shapes]
        total = sum(-(-n // ALIGN) * ALIGN for n in sizes)

        def fp32_views(flat: Any) -> list[Any]:
            out, at = [], 0
            for shape, n in zip(L.shapes, sizes, strict=True):
                out.append(flat[at : at + n].view(torch.float32).view(shape))
                at += -(-n // ALIGN) * ALIGN
            return out

        if fp32:  # the host copy of the weights is the master copy
            L.masters = L.views(L.weights)
            L.master_grads = L.views(L.grads) if L.grads is not None else []
        else:
            L.masters = fp32_views(self._host_alloc(total, False))
            L.master_grads = fp32_views(self._host_alloc(total, False))
            with torch.no_grad():
                for m, w in zip(L.masters, L.views(L.weights), strict=True):
                    m.copy_(w)
        if self._params_on_tier:
            L.master_grads = []  # the parameters' own gradients
        masters = [torch.nn.Parameter(m, requires_grad=True) for m in L.masters]
        L.masters = masters
        opt = factory(masters)
        if not isinstance(opt, torch.optim.Adam | torch.optim.AdamW):
            raise InvalidRequestError(
                f"optimizer {type(opt).__name__}: the state of Adam and AdamW is placed on "
                "the tier; other optimizers would keep theirs in ordinary memory"
            )
        amsgrad = any(g.get("amsgrad") for g in opt.param_groups)
        moments = [fp32_views(self._host_alloc(total, False)) for _ in range(3 if amsgrad else 2)]
        for k, m in enumerate(masters):
            st: dict[str, Any] = {
                "step": torch.tensor(0.0, dtype=torch.float32),
                "exp_avg": moments[0][k].zero_(),
                "exp_avg_sq": moments[1][k].zero_(),
            }
            if amsgrad:
                st["max_exp_avg_sq"] = moments[2][k].zero_()
            opt.state[m] = st
        L.optimizer = opt

    def _install_hooks(self, modules: list[Any]) -> None:
        for L, module in zip(self._layers, modules, strict=True):
            self._hooks.append(module.register_forward_pre_hook(
                functools.partial(self._before_forward, L)))  # fmt: skip
            if self.weights == "stream":
                self._hooks.append(module.register_forward_hook(
                    functools.partial(self._after_forward, L)))  # fmt: skip
            L.trainable = [k for k, p in enumerate(L.params) if p.requires_grad]
            for k in L.trainable:
                self._hooks.append(L.params[k].register_post_accumulate_grad_hook(
                    functools.partial(self._grad_ready, L)))  # fmt: skip

    # --- hooks ---------------------------------------------------------------------
    def _stream(self) -> Any:
        return import_torch().cuda.current_stream(self.device) if self._on_gpu else None

    def _before_forward(self, L: _Layer, module: Any, args: Any) -> None:
        if L.index == 0 and self.ring is not None:
            self._release_held()
            training = import_torch().is_grad_enabled() and any(M.trainable for M in self._layers)
            if training != self._training_order:
                n = len(self._layers)
                order = [*range(n), *reversed(range(n))] if training else list(range(n))
                self.ring.set_order(order)
                self._training_order = training
        if self.ring is not None:
            self._bind(L, self.ring.get(L.index, self._stream()))
        else:
            self._wait_for_update(L.index)
            if L.updated is not None:
                self.engine.wait(self._stream(), L.updated)

    def _after_forward(self, L: _Layer, module: Any, args: Any, output: Any) -> None:
        assert self.ring is not None
        self.ring.done(L.index, self._stream())
        self._unbind(L)
        # The layer is needed again when the gradient of its output arrives: a hook on
        # the output tensors (the first that fires) gets it back before its backward.
        outputs = output if isinstance(output, tuple | list) else (output,)
        needs = [t for t in outputs if getattr(t, "requires_grad", False)]
        if needs:
            pending = [True]

            def before_backward(grad: Any) -> None:
                if pending.pop() if pending else False:
                    self._release_held()
                    self._bind(L, self.ring.get(L.index, self._stream()))  # type: ignore[union-attr]
                    if not L.trainable:  # no gradient says when it is done: the next does
                        self._held.append(L)

            for t in needs:
                t.register_hook(before_backward)

    def _release_held(self) -> None:
        """Layers without trainable parameters, bound for their backward pass: the
        backward of the layer before them (or the next forward pass) means they are done."""
        assert self.ring is not None
        while self._held:
            H = self._held.pop()
            self.ring.done(H.index, self._stream())
            self._unbind(H)

    def _grad_ready(self, L: _Layer, param: Any) -> None:
        L.grads_ready += 1
        if L.grads_ready < len(L.trainable):
            return
        L.grads_ready = 0
        stream = self._stream()
        if self.ring is not None:
            self.ring.done(L.index, stream)
            self._unbind(L)
        if not self._params_on_tier:
            grads = L.views(L.grads)
            L.copies = [copy_to_host(self.engine, L.params[k].grad, grads[k], stream)
                        for k in L.trainable]  # fmt: skip
            self._bytes_to_host += sum(c.nbytes for c in L.copies)
            for k in L.trainable:
                L.params[k].grad = None  # the copy holds the gradient until it has landed
        if L.optimizer is not None:
            if self.ring is not None:
                self.ring.invalidate(L.index)  # its host weights change under the update
            self._wait_for_update(L.index)
            L.update = self._pool.submit(self._update, L)

    # --- the optimizer step of one layer (worker thread) ---------------------------
    def _fused_settings(self, L: _Layer) -> Any:
        """The layer's optimizer settings for the fused CPU step, or None where it is
        not one the fused step runs (amsgrad)."""
        from .adam import AdamSettings

        opt = L.optimizer
        if opt is None or len(opt.param_groups) != 1:
            return None
        try:
            return AdamSettings.of(opt, opt.param_groups[0])
        except InvalidRequestError:
            return None

    def _fused_update(self, L: _Layer) -> None:
        """One pass per parameter: the gradient (host copy, or the parameter's own),
        the master and moments on the tier, and the weight in the layer's dtype."""
        assert self._fused is not None
        settings = self._fused_settings(L)
        grads = L.views(L.grads) if not self._params_on_tier else []
        weights = L.views(L.weights)
        for k in L.trainable:
            master = L.masters[k]
            st = L.optimizer.state[master]
            st["step"] += 1
            grad = grads[k] if not self._params_on_tier else L.params[k].grad
            weight = weights[k] if weights[k].data_ptr() != master.data_ptr() else None
            state = (master.data.view(-1), st["exp_avg"].view(-1), st["exp_avg_sq"].view(-1))
            out = None if weight is None else weight.view(-1)
            grad = grad.contiguous().view(-1)
            self._fused.step(state, grad, out, int(st["step"].item()), settings)
            if self._params_on_tier:
                L.params[k].grad = None

    def _update(self, L: _Layer) -> None:
        torch = import_torch()
        for c in L.copies:
            c.wait()
        L.copies = []
        if self._fused is not None and self._fused_settings(L) is not None:
            self._fused_update(L)
            self._after_update(L)
            return
        with torch.no_grad():
            grads = L.views(L.grads) if not self._params_on_tier else []
            for k in L.trainable:
                m = L.masters[k]
                if not self._params_on_tier:  # gradients landed in host memory on the tier
                    mg, g = L.master_grads[k], grads[k]
                    if mg.data_ptr() != g.data_ptr():
                        mg.copy_(g)
                    m.grad = mg
                else:
                    g = L.params[k].grad
                    m.grad = g if g.dtype == torch.float32 else g.float()
            L.optimizer.step()
            for m in L.masters:
                m.grad = None
            for p in L.params if self._params_on_tier else ():
                p.grad = None
            for m, w in zip(L.masters, L.views(L.weights), strict=True):
                if m.data_ptr() != w.data_ptr():
                    w.copy_(m)  # fp32 master -> the layer's dtype
        self._after_update(L)

    def _after_update(self, L: _Layer) -> None:
        if self._on_gpu and self.weights == "resident":
            L.updated = copy_to_device(
                self.engine, L.weights, [p.data for p in L.params], L.offsets
            )
        with self._lock:
            self._updates += 1

    def _wait_for_update(self, index: int) -> None:
        import time

        pending = self._layers[index].update
        if pending is None:
            return
        t0 = time.perf_counter()
        pending.result()  # re-raises an error of the update
        self._update_wait_s += time.perf_counter() - t0
        self._layers[index].update = None

    # --- parameters in ring buffers --------------------------------------------------
    def _bind(self, L: _Layer, view: Any) -> None:
        key = (view.slot, L.index)
        views = self._views.get(key)
        if views is None:
            views = self._views[key] = L.views(ring_tensor(view, self.device))
        for p, v in zip(L.params, views, strict=True):
            p.data = v

    def _unbind(self, L: _Layer) -> None:
        for p in L.params:
            p.data = self._placeholders[id(p)]

    # --- what users ask ----------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for every optimizer step and copy in flight (before saving or
        evaluating the host copies)."""
        for L in self._layers:
            self._wait_for_update(L.index)
            for c in L.copies:
                c.wait()
            if L.updated is not None:
                self.engine.synchronize(L.updated)

    def host_tensors(self) -> list[Any]:
        """Every host tensor on the tier (weights, gradients, master weights, moments),
        each piece of memory once."""
        found: dict[tuple[int, int], Any] = {}
        for L in self._layers:
            tensors = [t for t in (L.weights, L.grads) if t is not None]
            tensors += [*L.masters, *L.master_grads]
            if L.optimizer is not None:
                for st in L.optimizer.state.values():
                    tensors += [v for k, v in st.items() if k != "step"]
            for t in tensors:
                found.setdefault((t.data_ptr(), t.numel() * t.element_size()), t)
        return list(found.values())

    def pages_by_node(self) -> dict[int, int]:
        """Pages of all its host memory per NUMA node, counted now."""
        from collections import Counter

        from ...numa.pages import pages_by_node

        total: Counter[int] = Counter()
        for t in self.host_tensors():
            total.update(pages_by_node(t))
        return dict(sorted(total.items()))

    def host_grads(self, layer: int) -> list[Any]:
        """The gradients of layer ``layer``'s parameters as last copied to the host
        (streamed layers without an optimizer), once they have landed."""
        L = self._layers[layer]
        if L.grads is None:
            raise InvalidRequestError("gradients stay with the parameters (on the tier)")
        for c in L.copies:
            c.wait()
        return L.views(L.grads)

    def stats(self) -> OffloadStats:
        """Bytes and copies so far, layers served from the ring without a copy, updates
        made, and how long forward passes waited for updates."""
        ring = self.ring.stats if self.ring is not None else None
        return OffloadStats(
            bytes_to_device=ring.bytes_in if ring else 0,
            bytes_to_host=self._bytes_to_host,
            copies_to_device=ring.copies_in if ring else 0,
            reused=ring.reused if ring else 0,
            updates=self._updates,
            update_wait_s=self._update_wait_s,
        )

    def close(self) -> None:
        """Wait for what is in flight, remove the hooks and free the device buffers
        (the layers' parameters keep pointing at host memory, or at placeholders when
        streamed: the layers are of no use after this)."""
        self.synchronize()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._pool.shutdown(wait=True)
        if self._fused is not None:
            self._fused.close()
        self._views.clear()  # views into the ring's device buffers, freed next
        if self.ring is not None:
            self.ring.close()
