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
the process once a step has spilled: a script that fits never has them). They are
installed only where the script has none of its own open (``save_on_cpu``, say): its
``with`` would pop ours at its exit and leave its own in place for good, and its own
already say where its saved tensors go. Like every such hook they hold for the thread
that ran the optimizer step (the one that runs the forward pass in a training loop; not
``DataParallel``'s worker threads), and nothing is sent while a CUDA graph is captured
(its copies and events would be replayed, not run). Leaves
(parameters, inputs, buffers), views and expanded tensors, tensors under 1 MiB and those
on the tier already are saved as they are, and unpacked only if unchanged since: with
hooks installed, autograd leaves that check to them; a sent tensor changed in place
while its copy out was under way is found when the copy ends (a change after that is
not: its version counter would hold its memory). The budget grows by what each
optimizer step spilled, by an eighth more; it does not shrink.

Memory is freed in the order of the stream it was made on, so each trip makes that
stream wait for it first: a tensor sent (made by the compute), its copy on the tier
(made where it was saved) and its copy back (made where the backward pass asked).
"""

from __future__ import annotations

import threading
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
NEVER = -2  # no backward pass has taken a saved tensor back (-1: outside any)


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
    trips run on the copy stream: ``sent`` ends the trip out, ``arrived`` the trip back.
    ``stream`` made the copy on the tier, ``back_stream`` the copy back. ``order`` is
    the list of what its forward pass sent (the backward pass asks in reverse); a
    later forward pass starts a list of its own."""

    __slots__ = ("__weakref__", "arrived", "back", "back_stream", "changed", "copy", "index",
                 "order", "sent", "stream", "used_in")  # fmt: skip

    def __init__(self, copy: Any, stream: Any, sent: Any, order: list[Any]) -> None:
        self.copy, self.stream, self.sent = copy, stream, sent
        self.order, self.index = order, len(order)
        self.back: Any = None  # in HBM, filled by the copy stream
        self.back_stream: Any = None
        self.arrived: Any = None  # the copy stream's event after it
        self.used_in = NEVER  # the backward pass (graph task) that last took it back
        self.changed = ""  # the in-place change found while it was sent, as PyTorch says it

    def __del__(self) -> None:
        # dropped before a backward pass took it back (a graph freed unused, or one
        # brought back ahead and not taken): its copies are freed in their streams'
        # order, which must first see the trips end
        if self.used_in != NEVER and self.back is None:
            return
        self.stream.wait_event(self.arrived or self.sent)
        if self.back_stream is not None and self.back_stream != self.stream:
            self.back_stream.wait_event(self.arrived)


@dataclass
class _Leaving:
    """An activation whose copy out is under way: held (detached: no graph) until it
    ends, then let go in the order of ``stream``, the stream current when it was saved
    (where the forward pass made it and may still read it)."""

    sent: Any
    tensor: Any
    version: int
    size: int
    stream: Any
    item: weakref.ref[_OnTier]


@dataclass
class SavedOffload:
    """The hooks of one spilling process; ``step_ended`` runs after each optimizer step.
    ``pack`` runs on the thread of the forward pass, or of the backward pass where a
    reentrant checkpoint runs its forward again there (what it saves there is kept: the
    same backward pass uses it); what the threads share is locked."""

    torch: Any
    slot: int
    device: int = 0
    budget: int = 0  # bytes of saved activations kept on the tier at a time
    _hooks: list[Any] = field(default_factory=list)
    _copier: dict[int, Any] = field(default_factory=dict)  # device -> copy stream
    # by device: activations whose copy out is under way, and their bytes
    _leaving: dict[int, deque[_Leaving]] = field(default_factory=dict)
    _leaving_bytes: dict[int, int] = field(default_factory=dict)
    # what the current forward pass sent, in the order saved
    _order: list[weakref.ref[_OnTier]] = field(default_factory=list)
    _asked: bool = False  # a backward pass has asked since the last pack: a new forward pass
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def step_ended(self) -> None:
        """Grow the budget by what the step spilled; install the hooks once one has (a
        step's end tries again while the script's own hooks keep ours out)."""
        spilled = compiled.tier_spilled_rise(self.device)
        budget = next_budget(self.budget, spilled)
        log.info("optimizer step ended: HBM lacked %d bytes in it", spilled)
        if budget != self.budget:
            log.info("the step spilled %d bytes: saved activations up to %d bytes go to "
                     "the tier", spilled, budget)  # fmt: skip
            self.budget = budget
        if self.budget:
            self.install_hooks()

    def install_hooks(self) -> bool:
        """Install the hooks for the rest of the process, on this thread (the one that
        runs the forward pass), unless they are, or the script has its own open (a next
        step's end tries again). True where they are installed now."""
        if self._hooks:
            return True
        top = getattr(self.torch._C._autograd, "_top_saved_tensors_default_hooks", None)
        if top is None or top(False) is not None:
            log.info("the script has saved-tensor hooks of its own open: saved activations "
                     "stay where those put them")  # fmt: skip
            return False
        hooks = self.torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        hooks.__enter__()
        self._hooks.append(hooks)
        return True

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
        if t._base is not None:
            return False  # a view: its base holds the memory (and may be saved too)
        if torch._C._current_graph_task_id() != -1:
            return False  # saved in a backward pass (a reentrant checkpoint): used in it
        if _capturing(torch, t.device):
            return False  # a trip's copies and events in a CUDA graph would be replayed
        if compiled.tier_owns(t.untyped_storage().data_ptr()):
            return False
        figures, _ = compiled.tier_use(t.device.index or 0)
        return figures["tier_saved_bytes"][0] + size <= self.budget

    def _copy_stream(self, device: Any) -> Any:
        index = device.index or 0
        if index not in self._copier:
            self._copier[index] = self.torch.cuda.Stream(device=device)
        return self._copier[index]

    def _let_go(self, device: int, size: int) -> None:
        """Drop the activations on ``device`` whose copy out has ended; where those still
        under way would hold more than IN_FLIGHT with ``size`` more, the oldest's stream
        waits for its copy (the compute, not the host: the HBM is reused in its order).
        Called with the lock held."""
        leaving = self._leaving.setdefault(device, deque())
        while leaving:
            first = leaving[0]
            if not first.sent.query():
                if self._leaving_bytes.get(device, 0) + size <= IN_FLIGHT:
                    return
                first.stream.wait_event(first.sent)
            leaving.popleft()
            self._leaving_bytes[device] -= first.size
            item = first.item()
            if item is not None and first.tensor._version != first.version:
                t = first.tensor
                item.changed = (
                    f"[{t.type()} {list(t.shape)}] is at version {t._version}; expected "
                    f"version {first.version} instead"
                )

    def pack(self, t: Any) -> Any:
        """A saved tensor: copied to the tier where worth it and in budget, else kept."""
        if not self._worth_sending(t):
            # kept with its version: with hooks installed autograd no longer checks that
            # a saved tensor was left unchanged, so unpack does
            return _Kept(t.detach(), t._version)
        before = (compiled.tier_prefer(self.slot), compiled.tier_kind(SAVED))
        try:
            copy = _allocated(self.torch, self.torch.empty_like(t))
        except RuntimeError:  # the tier is full too (out of memory): keep it where it is
            return _Kept(t.detach(), t._version)
        finally:
            compiled.tier_prefer(before[0])
            compiled.tier_kind(before[1])
        size = t.numel() * t.element_size()
        device = t.device.index or 0
        stream = self.torch.cuda.current_stream(t.device)
        copier = self._copy_stream(t.device)
        with self._lock:
            self._let_go(device, size)
            copier.wait_stream(stream)  # t written, the copy's memory free to write
            with self.torch.cuda.stream(copier):
                copy.copy_(t, non_blocking=True)
                sent = self.torch.cuda.Event()
                sent.record(copier)
            if self._asked:  # a backward pass ran since the last pack: a new forward
                self._order, self._asked = [], False
            item = _OnTier(copy, stream, sent, self._order)
            self._order.append(weakref.ref(item))
            # t's memory is let go once the copy ends: it is held detached, without the
            # grad_fn that would keep the graph (and every copy saved in it) alive
            self._leaving[device].append(
                _Leaving(sent, t.detach(), t._version, size, stream, weakref.ref(item))
            )
            self._leaving_bytes[device] = self._leaving_bytes.get(device, 0) + size
        return item

    def _bring_back(self, item: _OnTier, stream: Any) -> None:
        """Start ``item``'s copy back to HBM on the copy stream; the copy back is made on
        ``stream`` (where the backward pass will use it: it is freed in that stream's
        order) and written once the backward pass's current stream is there."""
        torch = self.torch
        with torch.cuda.stream(stream):
            back = _allocated(torch, torch.empty_like(item.copy))  # HBM, else the spill's tier
        copier = self._copy_stream(item.copy.device)
        copier.wait_stream(torch.cuda.current_stream(item.copy.device))
        copier.wait_stream(stream)
        with torch.cuda.stream(copier):
            back.copy_(item.copy, non_blocking=True)
            arrived = torch.cuda.Event()
            arrived.record(copier)
        item.back, item.back_stream, item.arrived = back, stream, arrived

    def _bring_back_ahead(self, item: _OnTier, task: int) -> None:
        """Bring back the tensors its forward pass sent before ``item`` (the backward
        pass's next), up to IN_FLIGHT bytes ahead of their use: each onto the stream it
        was saved on (where the backward pass runs its node). Where HBM and the tier are
        both out of room, what is ahead waits for its turn instead."""
        ahead = 0
        for i in range(item.index - 1, -1, -1):
            if ahead >= IN_FLIGHT:
                return
            earlier = item.order[i]()
            if earlier is None or earlier.used_in == task:
                continue
            if earlier.back is None:
                try:
                    self._bring_back(earlier, earlier.stream)
                except self.torch.OutOfMemoryError:  # the one asked for came first
                    log.info("no room to bring saved activations back ahead of their use")
                    return
            ahead += earlier.copy.numel() * earlier.copy.element_size()

    def unpack(self, packed: Any) -> Any:
        """The tensor the backward pass needs: brought back to HBM, or checked unchanged."""
        if isinstance(packed, _Kept):
            t = packed.tensor
            if t._version != packed.version:
                _modified(f"[{t.type()} {list(t.shape)}] is at version {t._version}; expected "
                          f"version {packed.version} instead")  # fmt: skip
            return t
        if not isinstance(packed, _OnTier):
            return packed
        if _capturing(self.torch, packed.copy.device):
            raise RuntimeError(
                "a backward pass captured in a CUDA graph needs an activation that pycxl "
                "spill sent to the tier in an uncaptured forward pass: capture the forward "
                "pass too (nothing is sent while a graph is captured)"
            )
        with self._lock:
            self._asked = True
            # the forward pass has ended: every copy out is let go, each checked for a
            # change made while it was under way (the streams wait, not the host)
            self._let_go(packed.copy.device.index or 0, IN_FLIGHT + 1)
            if packed.changed:
                _modified(packed.changed)
            stream = self.torch.cuda.current_stream(packed.copy.device)
            if packed.back is None:
                self._bring_back(packed, stream)
            task = self.torch._C._current_graph_task_id()
            packed.used_in = task
            self._bring_back_ahead(packed, task)
            stream.wait_event(packed.arrived)
            back = packed.back
            if packed.back_stream != stream:
                # brought back ahead onto the stream it was saved on, asked for on
                # another: a copy made here, so that this stream's use is not cut short
                # by a free in the other's order
                with self.torch.cuda.stream(stream):
                    back = _allocated(self.torch, back.clone())
                done = self.torch.cuda.Event()
                done.record(stream)
                packed.back_stream.wait_event(done)
            # the copies are freed in their streams' order (each trip back, a kept
            # graph's second too)
            for made in {packed.stream, packed.back_stream} - {stream, None}:
                made.wait_event(packed.arrived)
            packed.back = None  # a graph kept for a second pass asks again
        return back


def _capturing(torch: Any, device: Any) -> bool:
    """A CUDA graph is being captured on ``device``'s current stream."""
    with torch.cuda.device(device):
        return bool(torch.cuda.is_current_stream_capturing())


def _allocated(torch: Any, t: Any) -> Any:
    """``t``, made by the spill's allocator: a null pointer is its refusal (HBM and the
    tier both full), raised as PyTorch's own out of memory."""
    if t.numel() and t.data_ptr() == 0:
        raise torch.OutOfMemoryError(
            f"pycxl spill: no room in HBM or on the tier for {t.numel() * t.element_size()} "
            "bytes of saved activations"
        )
    return t


def _modified(what: str) -> None:
    raise RuntimeError(
        "one of the variables needed for gradient computation has been modified by an "
        f"inplace operation: {what} (as PyTorch reports it without pycxl spill)"
    )
