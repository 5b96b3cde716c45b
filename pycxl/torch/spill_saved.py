"""Activations saved for the backward pass, sent to the tier when a step does not fit.

What spills by default is whatever asks when HBM has run out, and kernels then read and
write it over the link many times a step. An activation saved for the backward pass is
written once and read once: sent to the tier as the forward pass saves it and brought
back as the backward pass reaches it, it crosses the link twice a step and never sits
under a kernel there. So where a step spilled (HBM lacked bytes at its peak), the next
steps keep up to that many bytes of saved activations on the tier, the first ones saved
(the last the backward pass needs), and the activations in use stay in HBM.

The trips run on a copy stream of their own, beside the compute: out as the forward pass
goes on (the activation's HBM is let go once its copy is done), back ahead of the
backward pass (the tensors saved before the one it asks for come back while it works on
that one), as activation offloading does.

The means are PyTorch's own (``torch.autograd.graph.saved_tensors_hooks``, installed for
the process once a step has spilled: a script that fits never has them). Leaves
(parameters, inputs, buffers), views and expanded tensors, tensors under 1 MiB and those
on the tier already are saved as they are, and unpacked only if unchanged since: with
hooks installed, autograd leaves that check to them. The budget grows by what each
optimizer step spilled, by an eighth more; it does not shrink.
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..base._lib import compiled
from ..base._log import get_logger

log = get_logger("pycxl.spill")
SMALLEST = 1 << 20  # smaller saved tensors stay: their trips cost more than they free
SAVED = compiled.USE_KINDS["saved_activations"]
# HBM that trips in flight may hold beyond the plan (at least one tensor's worth): an
# activation whose copy out is not done yet, and those brought back ahead of their use
IN_FLIGHT = 512 << 20


def next_budget(budget: int, spilled_in_step: int) -> int:
    """Bytes of saved activations to keep on the tier once a step spilled
    ``spilled_in_step`` bytes with ``budget`` kept there."""
    return budget + spilled_in_step + spilled_in_step // 8 if spilled_in_step > 0 else budget


@dataclass
class _Kept:
    """A saved tensor left where it is, with its version when saved. Detached: the
    tensor itself would hold its grad_fn, which holds this (a cycle the collector cannot
    see when the graph is dropped without a backward pass); the version counter is
    shared, and autograd gives the grad_fn back on unpack."""

    tensor: Any
    version: int


class _OnTier:
    """A saved tensor's copy on the tier, and its copy back once one is under way. Both
    trips run on the copy stream; ``stream`` is the one that made and frees the copies."""

    __slots__ = ("__weakref__", "arrived", "back", "copy", "index", "stream", "used")

    def __init__(self, copy: Any, stream: Any, index: int) -> None:
        self.copy, self.stream, self.index = copy, stream, index
        self.back: Any = None  # in HBM, filled by the copy stream
        self.arrived: Any = None  # the copy stream's event after it
        self.used = False

    def __del__(self) -> None:
        # dropped before the backward pass took it back (a graph freed unused): the
        # memory is freed in ``stream``'s order, which must first see the trips end
        if not self.used and self.arrived is not None:
            self.stream.wait_event(self.arrived)


@dataclass
class SavedOffload:
    """The hooks of one spilling process; ``step_ended`` runs after each optimizer step."""

    torch: Any
    slot: int
    device: int = 0
    budget: int = 0  # bytes of saved activations kept on the tier at a time
    _hooks: list[Any] = field(default_factory=list)
    _copier: dict[int, Any] = field(default_factory=dict)  # device -> copy stream
    # activations whose copy out is under way (event, storage, bytes): held until it ends
    _leaving: deque[tuple[Any, Any, int]] = field(default_factory=deque)
    _leaving_bytes: int = 0
    # what went to the tier, in the order saved (the backward pass asks in reverse)
    _order: list[weakref.ref[_OnTier]] = field(default_factory=list)

    def step_ended(self) -> None:
        """Grow the budget by what the step spilled; install the hooks the first time."""
        spilled = compiled.tier_spilled_rise(self.device)
        budget = next_budget(self.budget, spilled)
        log.info("optimizer step ended: HBM lacked %d bytes in it", spilled)
        if budget == self.budget:
            return
        log.info("the step spilled %d bytes: saved activations up to %d bytes go to the tier",
                 spilled, budget)  # fmt: skip
        self.budget = budget
        if not self._hooks:
            hooks = self.torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
            hooks.__enter__()  # for the rest of the process, on the thread that runs forward
            self._hooks.append(hooks)

    def _worth_sending(self, t: Any) -> bool:
        torch = self.torch
        # a plain dense tensor that is all of its memory: a view or an expanded tensor
        # would be copied whole (larger than what it frees), a subclass may have no
        # memory of its own, and a leaf (weights, inputs, buffers) is held elsewhere
        if type(t) is not torch.Tensor or not t.is_cuda or t.layout != torch.strided:
            return False
        size: int = t.numel() * t.element_size()
        if size < SMALLEST or t.is_leaf or t.untyped_storage().nbytes() != size:
            return False
        if isinstance(t._base, torch.nn.Parameter):
            return False  # weights live where they live: a copy would double them
        if compiled.tier_owns(t.untyped_storage().data_ptr()):
            return False
        figures, _ = compiled.tier_use(t.device.index or 0)
        return figures["tier_saved_bytes"][0] + size <= self.budget

    def _copy_stream(self, device: Any) -> Any:
        index = device.index or 0
        if index not in self._copier:
            self._copier[index] = self.torch.cuda.Stream(device=device)
        return self._copier[index]

    def _let_go(self, stream: Any, size: int) -> None:
        """Drop the activations whose copy out has ended; where those still under way
        would hold more than IN_FLIGHT with ``size`` more, ``stream`` waits for the
        oldest (the compute, not the host: the HBM is reused in its order)."""
        while self._leaving:
            event, _, nbytes = self._leaving[0]
            if not event.query():
                if self._leaving_bytes + size <= IN_FLIGHT:
                    return
                stream.wait_event(event)
            self._leaving.popleft()
            self._leaving_bytes -= nbytes

    def pack(self, t: Any) -> Any:
        """A saved tensor: copied to the tier where worth it and in budget, else kept."""
        if not self._worth_sending(t):
            # kept with its version: with hooks installed autograd no longer checks that
            # a saved tensor was left unchanged, so unpack does
            return _Kept(t.detach(), t._version)
        before = (compiled.tier_prefer(self.slot), compiled.tier_kind(SAVED))
        try:
            copy = self.torch.empty_like(t)
        except RuntimeError:  # the tier is full too: keep it where it is
            return _Kept(t.detach(), t._version)
        finally:
            compiled.tier_prefer(before[0])
            compiled.tier_kind(before[1])
        size = t.numel() * t.element_size()
        stream = self.torch.cuda.current_stream(t.device)
        self._let_go(stream, size)
        copier = self._copy_stream(t.device)
        copier.wait_stream(stream)  # t written, the copy's memory free to write
        with self.torch.cuda.stream(copier):
            copy.copy_(t, non_blocking=True)
            sent = self.torch.cuda.Event()
            sent.record(copier)
        # t's memory is let go once the copy ends: its storage is held, not t, whose
        # grad_fn would keep the graph (and every copy saved in it) alive with it
        self._leaving.append((sent, t.untyped_storage(), size))
        self._leaving_bytes += size
        while self._order and _spent(self._order[-1]):
            self._order.pop()  # a backward pass took them all: a new forward pass
        item = _OnTier(copy, stream, len(self._order))
        self._order.append(weakref.ref(item))
        return item

    def _bring_back(self, item: _OnTier) -> None:
        """Start ``item``'s copy back to HBM on the copy stream."""
        torch = self.torch
        item.back = torch.empty_like(item.copy)  # in HBM (the spill's net below)
        copier = self._copy_stream(item.copy.device)
        copier.wait_stream(item.stream)  # the memory is free to write
        with torch.cuda.stream(copier):
            item.back.copy_(item.copy, non_blocking=True)
            item.arrived = torch.cuda.Event()
            item.arrived.record(copier)

    def _bring_back_ahead(self, item: _OnTier) -> None:
        """Bring back the tensors saved before ``item`` (the backward pass's next), up to
        IN_FLIGHT bytes ahead of their use."""
        ahead = 0
        for i in range(min(item.index, len(self._order)) - 1, -1, -1):
            if ahead >= IN_FLIGHT:
                return
            earlier = self._order[i]()
            if earlier is None or earlier.used:
                continue
            if earlier.back is None:
                self._bring_back(earlier)
            ahead += earlier.copy.numel() * earlier.copy.element_size()

    def unpack(self, packed: Any) -> Any:
        """The tensor the backward pass needs: brought back to HBM, or checked unchanged."""
        if isinstance(packed, _Kept):
            if packed.tensor._version != packed.version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified "
                    f"by an inplace operation: [{packed.tensor.type()} {list(packed.tensor.shape)}]"
                    f" is at version {packed.tensor._version}; expected version "
                    f"{packed.version} instead (as PyTorch reports it without pycxl spill)"
                )
            return packed.tensor
        if not isinstance(packed, _OnTier):
            return packed
        self._let_go(packed.stream, 0)
        if packed.back is None:
            self._bring_back(packed)
        self._bring_back_ahead(packed)
        stream = self.torch.cuda.current_stream(packed.copy.device)
        stream.wait_event(packed.arrived)
        back = packed.back
        if not packed.used and stream != packed.stream:
            packed.stream.wait_event(packed.arrived)  # the copies are freed in its order
        packed.used, packed.back = True, None  # a graph kept for a second pass asks again
        return back


def _spent(ref: weakref.ref[_OnTier]) -> bool:
    item = ref()
    return item is None or item.used
