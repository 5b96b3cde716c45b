"""PyTorch layers whose weights live on a memory tier and are streamed to the GPU as
they run, and whose optimizer state stays on the tier (the ZeRO-Offload pattern): the
ferry (ferry.py, the weight streaming ``offload_model`` uses too) plus a per-layer
optimizer.

``LayerOffload(layers, ...)`` takes a model's layers (a sequence of modules run in
order) and:

- ``weights="stream"``: each layer's parameters live in pinned host memory on the tier
  and visit the device only while the layer runs (``WeightFerry``: a ring of
  ``lookahead + 1`` device buffers, the next layer's copy behind this one's compute; in
  training the gradients go home as each layer has them). Between uses a parameter is
  its home on the tier: GPU memory holds the ring, never the model.
- ``weights="resident"``: the parameters stay on the device; only gradients go to the
  host and updated weights come back.
- ``optimizer`` (an Adam or AdamW factory): each layer's fp32 master weights, and the
  optimizer's moments, live on the tier (unpinned: only the CPU touches them). As soon
  as a layer's gradients have landed, a worker thread runs the optimizer step for that
  layer on the CPU (layer_update.py), while the GPU runs the backward pass of the
  layers before it; the new weights are home, or copied back, before the layer runs
  again. Each backward pass is a step: its gradients are consumed, and ``.grad`` stays
  None.

On the CPU (``device`` "cpu", a machine without a GPU) the parameters themselves move
onto the tier and the optimizer updates them there, in place.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from ...base.errors import InvalidRequestError
from ...gpu.engine import Engine, copy_to_device, copy_to_host
from ...gpu.host_engine import HostEngine
from .._import import import_torch
from .ferry import AtBackwardEnd, WeightFerry
from .host_memory import HostAlloc, pages_of
from .layer_update import LayerUpdate
from .layout import Block, layout_blocks, piece

Weights = Literal["stream", "resident"]


def default_optimizer(params: list[Any]) -> Any:
    """Adam (lr 1e-3), fused on the CPU where this PyTorch has it."""
    torch = import_torch()
    try:
        return torch.optim.Adam(params, lr=1e-3, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=1e-3, foreach=True)


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
    a HostEngine for the CPU); ``device`` is where the layers compute."""

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
        seen: set[int] = set()
        for i, module in enumerate(modules):
            own = [p for p in module.parameters() if id(p) not in seen]
            seen.update(id(p) for p in own)
            if not own:
                raise InvalidRequestError(
                    f"layer {i} ({type(module).__name__}) has no parameters of its own (none, "
                    "or only an earlier layer's): give layers that hold their parameters"
                )
        if weights == "resident" and optimizer is None:
            raise InvalidRequestError(
                "weights='resident' keeps the layers on the device: give an optimizer "
                "to offload (or weights='stream' to stream the layers)"
            )
        self.weights: Weights = weights
        self.engine = engine
        self._on_gpu = on_gpu
        self._streamed = weights == "stream"
        # On the CPU, resident parameters live on the tier themselves: no copies at all
        self._params_on_tier = not on_gpu and not self._streamed
        self._host_alloc = host_alloc
        trainable = {id(p): 0 for m in modules for p in m.parameters() if p.requires_grad}
        # resident, a layer's parameters may mix dtypes (nothing streams them as one)
        self._blocks = layout_blocks(modules, trainable, with_frozen=True,
                                     split_dtypes=not self._streamed)  # fmt: skip
        self._position = {id(B): k for k, B in enumerate(self._blocks)}
        self._updates: list[LayerUpdate | None] = [None] * len(self._blocks)
        self._hooks: list[Any] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pycxl-update")
        self._lock = threading.Lock()
        self._update_count = 0
        self._update_wait_s = 0.0
        self._bytes_to_host = 0
        self._end = AtBackwardEnd(self._backward_done)  # resident: layers left partial
        self._place_host_memory()
        if optimizer is not None:
            for k, B in enumerate(self._blocks):
                if B.params:
                    self._updates[k] = LayerUpdate.placed(
                        B, optimizer, self._typed, params_on_tier=self._params_on_tier
                    )
        # The fused CPU step (one pass: gradient in, master and moments, weight out) for
        # Adam and AdamW; PyTorch's step for what it does not run
        self._fused = None
        first = next((U for U in self._updates if U is not None), None)
        if cpus and first is not None and first.fused_settings() is not None:
            from .adam import CpuAdam

            self._fused = CpuAdam(cpus)
        self.ferry: WeightFerry | None = None
        if self._streamed:
            self.ferry = WeightFerry(
                self._blocks, engine, self.device, lookahead=lookahead,
                before_copy=self._wait_for_update, host_alloc=self._gradient_memory,
                on_home=self._sent_home if optimizer is not None else None,
                accumulate=optimizer is None,
            )  # fmt: skip
        else:
            self._install_resident_hooks()

    # --- set-up --------------------------------------------------------------------
    def _typed(self, elements: int, dtype: Any, pinned: bool) -> Any:
        return self._host_alloc(elements * dtype.itemsize, pinned).view(dtype)

    def _gradient_memory(self, B: Block) -> Any:
        return self._typed(B.numel, B.dtype, self._on_gpu)

    def _place_host_memory(self) -> None:
        """Streamed: each layer's home (the ferry moves the parameters there) and its
        gradients'. Resident: the host copies of the gradients and new weights, or on
        the CPU, the parameters themselves on the tier."""
        torch = import_torch()
        for B in self._blocks:
            if self._streamed:
                B.weights = self._typed(B.total, B.dtype, self._on_gpu)
                B.grads = self._typed(B.numel, B.dtype, self._on_gpu) if B.params else None
                continue
            # on the CPU every parameter lives on the tier; on a GPU the host keeps the
            # trainable ones' new weights, and every parameter is on the device
            B.weights = self._typed(B.total if self._params_on_tier else B.numel, B.dtype,
                                    self._on_gpu)  # fmt: skip
            with torch.no_grad():
                for p in B.everything:
                    if self._params_on_tier:
                        home = piece(B.weights, p).view(p.shape)
                        home.copy_(p.param.detach())
                        p.param.data = home
                        continue
                    if p in B.params:  # trainable: its host copy for the updates
                        piece(B.weights, p).view(p.shape).copy_(p.param.detach())
                    if p.param.device != self.device:
                        p.param.data = p.param.data.to(self.device)
            if not self._params_on_tier and B.params:
                B.grads = self._typed(B.numel, B.dtype, True)

    def _install_resident_hooks(self) -> None:
        """Resident: each layer's forward pass waits for its update; its gradients,
        once all accumulated, go home (on a GPU) and begin its update."""
        for k, B in enumerate(self._blocks):
            self._hooks.append(B.module.register_forward_pre_hook(
                functools.partial(self._before_forward, k)))  # fmt: skip
            for j, p in enumerate(B.params):
                self._hooks.append(p.param.register_post_accumulate_grad_hook(
                    functools.partial(self._grad_ready, k, j)))  # fmt: skip

    # --- hooks (resident) -------------------------------------------------------------
    def _stream(self) -> Any:
        return import_torch().cuda.current_stream(self.device) if self._on_gpu else None

    def _before_forward(self, k: int, module: Any, args: Any) -> None:
        self._wait_for_update(k)
        U = self._updates[k]
        if U is not None and U.updated is not None:
            self.engine.wait(self._stream(), U.updated)

    def _grad_ready(self, k: int, j: int, param: Any) -> None:
        U = self._updates[k]
        assert U is not None
        U.took.append(j)
        self._end.ask()
        if len(U.took) == len(self._blocks[k].params):
            self._begin_update(k)

    def _begin_update(self, k: int) -> None:
        """Resident: the layer's update of the parameters that took a gradient, their
        gradients first copied to the host (on a GPU)."""
        B, U = self._blocks[k], self._updates[k]
        assert U is not None
        took, U.took = sorted(U.took), []
        self._wait_for_update(k)  # the last one's copies are its own
        if not self._params_on_tier:
            stream = self._stream()
            U.copies = [copy_to_host(self.engine, B.params[j].param.grad,
                                     piece(B.grads, B.params[j]).view(B.params[j].shape),
                                     stream) for j in took]  # fmt: skip
            self._bytes_to_host += sum(c.nbytes for c in U.copies)
            for j in took:
                B.params[j].param.grad = None  # the copy holds it until it has landed
        U.pending = self._pool.submit(self._update, k, took)

    def _backward_done(self) -> None:
        """Resident: the backward pass ended; layers some of whose parameters took no
        gradient begin their update with those that did."""
        for k, U in enumerate(self._updates):
            if U is not None and U.took:
                self._begin_update(k)

    # --- the ferry's (streamed) ---------------------------------------------------------
    def _sent_home(self, B: Block, adding: bool, sent: list[int]) -> None:
        """A streamed layer's gradients of ``sent`` are on their way home: their update
        begins (the home weights change under it, so the device copy is stale)."""
        assert self.ferry is not None
        k = self._position[id(B)]
        U = self._updates[k]
        if U is None:
            return
        self.ferry.invalidate(B)
        self._wait_for_update(k)
        U.pending = self._pool.submit(self._update, k, sent)

    # --- the optimizer step of one layer (worker thread) ---------------------------
    def _grads_of(self, k: int) -> list[Any]:
        """The layer's gradients, landed: home (streamed or resident on a GPU), or the
        parameters' own (on the tier)."""
        B, U = self._blocks[k], self._updates[k]
        assert U is not None
        if self._params_on_tier:
            return [p.param.grad for p in B.params]  # None for one that took none
        if self._streamed:
            self.engine.synchronize(B.flight.landed)
        for c in U.copies:
            c.wait()
        U.copies = []
        return [piece(B.grads, p).view(p.shape) for p in B.params]

    def _update(self, k: int, took: list[int]) -> None:
        """The step of the layer's parameters ``took`` (positions among its trainable
        ones; the others took no gradient this pass and, as in torch's Adam, no step)."""
        B, U = self._blocks[k], self._updates[k]
        assert U is not None
        weights = [piece(B.weights, p).view(p.shape) for p in B.params]
        U.step(self._grads_of(k), weights, self._fused, took)
        for j in took if self._params_on_tier else ():
            B.params[j].param.grad = None
        if self._on_gpu and not self._streamed:
            moved = [B.params[j] for j in took]
            U.updated = copy_to_device(self.engine, [piece(B.weights, p) for p in moved],
                                       [p.param.data for p in moved])  # fmt: skip
        with self._lock:
            self._update_count += 1

    def _wait_for_update(self, k: int) -> None:
        U = self._updates[k]
        if U is None or U.pending is None:
            return
        t0 = time.perf_counter()
        U.pending.result()  # re-raises an error of the update
        self._update_wait_s += time.perf_counter() - t0
        U.pending = None

    # --- what users ask ----------------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for every optimizer step and copy in flight (before saving or
        evaluating the host copies)."""
        for k, U in enumerate(self._updates):
            self._wait_for_update(k)
            if U is None:
                continue
            for c in U.copies:
                c.wait()
            if U.updated is not None:
                self.engine.synchronize(U.updated)

    def host_tensors(self) -> list[Any]:
        """Every host tensor on the tier (weights, gradients, master weights, moments),
        each piece of memory once."""
        found: dict[tuple[int, int], Any] = {}
        for B, U in zip(self._blocks, self._updates, strict=True):
            tensors = [t for t in (B.weights, B.grads, B.incoming) if t is not None]
            if U is not None:
                tensors += U.tensors()
            for t in tensors:
                found.setdefault((t.data_ptr(), t.numel() * t.element_size()), t)
        return list(found.values())

    def pages_by_node(self) -> dict[int, int]:
        """Pages of all its host memory per NUMA node, counted now."""
        return pages_of(self.host_tensors())

    def host_grads(self, layer: int) -> list[Any]:
        """The gradients of layer ``layer``'s trainable parameters as last copied to
        the host, once they have landed (streamed layers without an optimizer: each
        parameter's ``.grad`` is this memory too); a layer whose parameters mix dtypes
        gives them by dtype, in the order its parameters first show each."""
        mine = [k for k, B in enumerate(self._blocks) if B.index == layer]
        if not mine:
            raise InvalidRequestError(
                f"layer {layer}: this offload's layers are 0 to {self._blocks[-1].index}"
            )
        if self._params_on_tier:
            raise InvalidRequestError("gradients stay with the parameters (on the tier)")
        out: list[Any] = []
        for k in mine:
            B, U = self._blocks[k], self._updates[k]
            for c in U.copies if U is not None else ():
                c.wait()
            if B.grads is not None:
                out += [piece(B.grads, p).view(p.shape) for p in B.params]
        if not out:
            raise InvalidRequestError(
                f"layer {layer} takes no gradients: its parameters are frozen"
            )
        return out

    def stats(self) -> OffloadStats:
        """Bytes and copies so far, layers served from the ring without a copy, updates
        made, and how long forward passes waited for updates."""
        ring = self.ferry.ring.stats if self.ferry is not None else None
        home = self.ferry.bytes_home if self.ferry is not None else self._bytes_to_host
        return OffloadStats(
            bytes_to_device=ring.bytes_in if ring else 0,
            bytes_to_host=home,
            copies_to_device=ring.copies_in if ring else 0,
            reused=ring.reused if ring else 0,
            updates=self._update_count,
            update_wait_s=self._update_wait_s,
        )

    def close(self) -> None:
        """Wait for what is in flight, remove the hooks and free the device buffers
        (streamed parameters stay home, on the tier; resident ones on the device)."""
        self.synchronize()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self.ferry is not None:
            self.ferry.close()
        self._pool.shutdown(wait=True)
        if self._fused is not None:
            self._fused.close()
