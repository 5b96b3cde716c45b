"""Spilled weights read through HBM by copy, in forward passes without gradients.

A token of inference reads every weight once. A weight that spilled is read where it
lives, by the kernel's own loads over the link, which fall short of the copy engine's
rate (``benchmarks/tier_tensors.py`` measures both). So once a forward pass without
gradients (``no_grad``, ``inference_mode``: what ``generate`` runs) has shown the order
in which modules are called, each module whose weight is on the tier (a bias too small
to have spilled is copied with it) gets its own parameters copied into a ring of HBM
buffers ahead of its call, on a copy stream of its own (the next modules' copies run
beside the current one's compute); the module computes from the copies, and its
parameters are put back after the call.

What spilled is what was made last (the last layers, the head), so a token's reads over
the link came after the host had launched its HBM part, and a token ends in a sync: the
two could not overlap. The plan exchanges them, module for module, for those called
first (not one called more than once a pass: each call would copy it), so that a token
begins with the link's copies while the host launches the rest; a module comes back to
HBM only once others have left it for its bytes, so the tier holds at most one module's
bytes more. Where HBM has no room for the ring, embedding tables move to the tier, then
the modules in HBM called next, streamed with the rest. A plan the memory cannot take
(the tier full) is given up, each exchange it began undone: the weights are read in
place.

Off with gradients on (a backward pass would save what the call read), while
``torch.compile`` traces, while a CUDA graph is captured and under a dispatch mode. Only
modules without parameters of their children are streamed (a parent would hold its slot
while its children's copies arrive); a module called out of the learnt order waits for
its own copy; a weight changed since its copy (its version or storage) is copied again,
and each copy waits for the compute enqueued before it. One device, one thread: spilled
weights on several devices are read in place. The hooks are global (the script is
unchanged), so every module call pays for two Python calls.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..base._log import get_logger
from ..base.errors import PycxlError

log = get_logger("pycxl.spill")

SLOTS = 3  # the ring: a module's copies in use, and the next two modules' on their way
SMALLEST = 1 << 20  # parameters under this stay where they are (their trips cost more)
QUIET_PASSES = 3  # passes without gradients that read no weight on the tier: then off


@dataclass
class Seams:
    """How the streamer sees and moves memory: the tier's and CUDA's by default;
    tests give CPU tensors marked as on the tier."""

    on_tier: Callable[[Any], bool]  # whether a tensor's memory is on the tier
    to_tier: Callable[[Any], Any]  # a copy of a tensor on the tier
    hbm_room: Callable[[Any], int | None]  # bytes HBM can still give on a device
    in_hbm: Callable[[Any, int], Any]  # an uninitialised byte buffer in HBM, or None
    to_hbm: Callable[[Any], Any] | None = None  # a copy of a tensor in HBM, or None
    trained: Callable[[], bool] | None = None  # whether an optimizer has stepped


class WeightStreamer:
    """The forward hooks' state: the modules' order as called, learnt in the first
    forward pass without gradients, the ring, and the parameters swapped out."""

    def __init__(self, torch: Any, seams: Seams, device_type: str = "cuda") -> None:
        self.torch = torch
        self.seams = seams
        self.device_type = device_type
        self.handles: list[Any] = []
        self._seen: list[weakref.ref[Any]] = []  # module calls of the first pass, in order
        self._seen_ids: set[int] = set()
        self._open: list[int] = []  # the learnt pass's calls under way, outermost first
        self._order: list[weakref.ref[Any]] = []  # modules streamed, in call order
        self._index: dict[int, int] = {}  # id(module) -> its place in _order
        self._ring: list[Any] = []  # SLOTS byte buffers in HBM
        # order place -> its slot, the copy's end, and what it copied (each parameter's
        # version and storage then: a weight changed since is copied again)
        self._copied: dict[int, tuple[int, Any, list[tuple[int, int]]]] = {}
        self._device: Any = None  # the streamed modules' device
        self._issued = 0  # copies issued, for the slot of the next
        # id(module) -> each parameter swapped, with its own data
        self._swapped: dict[int, list[tuple[Any, Any]]] = {}
        self._stream: Any = None
        self.state = "learning"  # then "streaming", or "off" (said in the log, why)
        self.moved_bytes = 0  # HBM parameters moved to the tier for the ring's room
        self.exchanged_bytes = 0  # the tier's modules' bytes exchanged for ones called first
        self._calls: dict[int, int] = {}  # id(module) -> its calls in the pass being learnt
        self._moved: list[Any] = []  # those parameters
        self._next_read = 0  # the order place of the module expected next
        self._quiet = 0  # passes learnt in a row that read no weight on the tier

    # -- the hooks ----------------------------------------------------------------
    def before(self, module: Any, args: Any) -> None:
        """A module's call begins: learn the order, or swap in its copies."""
        if self.state == "off":
            if self.handles and not self._swapped:
                # unhooked here, where PyTorch calls a copy of its hook lists: a process
                # that trains or spilled no weight pays nothing a module call from now
                self.remove()
            return
        if self.torch.is_grad_enabled():
            if not self.torch.compiler.is_compiling():  # training reads them in place
                if self.state == "streaming":
                    self.stop("a forward pass with gradients")
                else:
                    self._off("a forward pass with gradients", expected=True)
            return
        if not self._runs_now():
            return
        if self.state == "learning":
            self._open.append(id(module))
            self._calls[id(module)] = self._calls.get(id(module), 0) + 1
            if id(module) not in self._seen_ids:
                self._seen_ids.add(id(module))
                self._seen.append(weakref.ref(module))
            return
        place = self._index.get(id(module))
        if place is None:
            return
        if place != self._next_read:
            self._restart()
        self._issue_ahead(place)
        copied = self._copied.pop(place, None)
        if copied is not None and copied[2] != _versions(self._params(module)):
            self._wait(copied[1])  # changed since its copy (between generate calls)
            self._restart()
            self._issue_ahead(place)
            copied = self._copied.pop(place, None)
        if copied is None:  # its module was gone when the copy was due
            return
        slot, loaded, _ = copied
        self._wait(loaded)
        swapped, offset, buffer = [], 0, self._ring[slot]
        for p in self._params(module):
            n = p.numel() * p.element_size()
            own = p.data
            p.data = buffer[offset : offset + n].view(p.dtype).view(p.shape)
            swapped.append((p, own))
            offset += _aligned(n)
        self._swapped[id(module)] = swapped
        self._next_read = (place + 1) % len(self._order)

    def after(self, module: Any, args: Any, output: Any) -> None:
        """A module's call ended (or raised): its parameters put back; the end of the
        outermost call of a pass being learnt plans the next."""
        for p, own in self._swapped.pop(id(module), []):
            p.data = own
        if self._open and self._open[-1] == id(module):
            self._open.pop()
            if not self._open and self.state == "learning":
                self._pass_learnt()

    def stop(self, why: str) -> None:
        """Streaming ends for good: the ring given back, the parameters moved to make its
        room back in HBM (where it has room for them)."""
        self._restart()
        self._ring = []
        back = 0
        for p in self._moved:
            if self.seams.to_hbm is not None:
                moved = self.seams.to_hbm(p.data)
                if moved is not None:
                    p.data = moved
                    back += p.numel() * p.element_size()
        self._moved = []
        self._off(f"{why}; {back} of {self.moved_bytes} bytes of parameters moved back to HBM")

    # -- learning the order ---------------------------------------------------------
    def _pass_learnt(self) -> None:
        """A pass without gradients ended: plan from it where it read weights on the
        tier, else forget it (a call outside the model, say) and learn the next."""
        modules = [m for m in (r() for r in self._seen) if m is not None]
        repeated = {i for i, n in self._calls.items() if n > 1}
        self._seen, self._seen_ids, self._calls = [], set(), {}  # forgotten whatever comes
        if not any(self._big(m) and self._on_tier(m) for m in modules):
            self._quiet += 1
            if self._quiet >= QUIET_PASSES:
                self._off(f"{QUIET_PASSES} passes without gradients read no weight on the "
                          "tier", expected=True)  # fmt: skip
            return
        try:
            with self.torch.inference_mode(False):  # the ring, moves: plain tensors
                self._plan(modules, repeated)
        except (PycxlError, MemoryError, self.torch.OutOfMemoryError) as e:
            self.stop(f"its plan failed ({e})")  # a move the tier could not take, say

    def _plan(self, modules: list[Any], repeated: set[int]) -> None:
        """A pass that read weights on the tier is over: choose from its modules, in
        call order, what to stream, and make the ring; ``repeated``: the ids of those
        called more than once in it (moved to the tier, each call would copy them)."""
        if not self._streamed(modules, None):
            return self._off(
                "no module with weights on the tier can be streamed (embedding tables and "
                "modules with children's parameters are read in place)"
            )
        if self.seams.trained is not None and self.seams.trained():  # an evaluation pass:
            return self._off("an optimizer has stepped in this process", expected=True)
        devices = {self._params(m)[0].device for m in self._streamed(modules, None)}
        if len(devices) > 1:
            return self._off("the spilled weights are on several devices")
        device = self._device = devices.pop()
        self._tier_first(modules, device, repeated)
        # what moves for the ring's room: embedding tables first (a token reads a row of
        # one, in place; not one whose weight a Linear shares), then the modules called
        # first of those in HBM (the tier holds the first ones called), streamed too
        shared = {id(p) for m in modules if not _reads_rows(m) for p in self._params(m)}

        def rows_only(m: Any) -> bool:
            return _reads_rows(m) and not any(id(p) in shared for p in self._params(m))

        movable = [m for m in modules if self._big(m) and self._in_hbm(m)
                   and id(m) not in repeated and self._params(m)[0].device == device]  # fmt: skip
        movable.sort(key=lambda m: not rows_only(m))  # stable: then in call order
        while (self.seams.hbm_room(device) or 0) < self._need(modules, device) and movable:
            for p in self._params(movable.pop(0)):
                if not self.seams.on_tier(p):  # a tied weight may have moved already
                    p.data = self.seams.to_tier(p.data)
                    self._moved.append(p)
                    self.moved_bytes += p.numel() * p.element_size()
        need = self._need(modules, device)
        ring: list[Any] = []
        for _ in range(SLOTS):
            ring.append(self.seams.in_hbm(device, need // SLOTS))
            if ring[-1] is None:
                ring.clear()  # given back first: the moves back need the room
                return self.stop(f"HBM has no room for {need} bytes of buffers")
        streamed = self._streamed(modules, device)
        position = {id(m): k for k, m in enumerate(modules)}
        streamed.sort(key=lambda m: position[id(m)])
        self._ring = ring
        self._order = [weakref.ref(m) for m in streamed]
        self._index = {id(m): k for k, m in enumerate(streamed)}
        self._next_read = 0
        self.state = "streaming"
        log.warning("spilled weights of %d modules read through HBM by copy (%d bytes of "
                    "buffers; %d bytes of parameters moved to the tier to make room; %d "
                    "bytes of the tier's modules exchanged for ones called first)",
                    len(streamed), need, self.moved_bytes, self.exchanged_bytes)  # fmt: skip

    def _tier_first(self, modules: list[Any], device: Any, repeated: set[int]) -> None:
        """The tier's share of the streamable modules made the ones called first, HBM
        keeping the last: a token then begins with its copies over the link, beside the
        host's launch of the rest of its kernels, instead of starting them once the host
        has launched the HBM part (a token ends in a sync: what comes after the link's
        reads cannot hide them). Module for module: a module called late comes back to
        HBM only once modules called early have left it for at least its bytes (the tier
        then holds at most one module's bytes more than before); one too large for what
        may leave stays."""
        if self.seams.to_hbm is None:
            return
        candidates = [m for m in self._streamed(modules, device, on_tier=False)
                      if id(m) not in repeated
                      and not self._shares_weights(m, modules)]  # fmt: skip
        budget = sum(self._bytes(m) for m in candidates if self._on_tier(m))
        first: set[int] = set()
        for m in candidates:
            if self._bytes(m) > budget:
                break
            first.add(id(m))
            budget -= self._bytes(m)
        leave = [m for m in candidates if id(m) in first and self._in_hbm(m)]
        come = [m for m in reversed(candidates) if id(m) not in first and self._on_tier(m)]
        available = sum(self._bytes(m) for m in leave)
        credit = 0  # bytes sent to the tier and not yet taken back by one that came
        for module in come:
            needed = self._bytes(module)
            if credit + available < needed:
                continue
            out: list[Any] = []
            sending = 0
            while credit + sending < needed:
                out.append(leave.pop(0))
                sending += self._bytes(out[-1])
            available -= sending
            coming = self._tier_bytes(module)
            if not self._exchange(out, module, device):
                return
            credit += sending - needed
            self.exchanged_bytes += coming

    def _exchange(self, out: list[Any], back: Any, device: Any) -> bool:
        """``out`` moved to the tier, then ``back`` to HBM in the room they left; where a
        step fails (or raises), those of ``out`` that moved go back to HBM."""
        sent: list[Any] = []
        try:
            for module in out:
                if not self._move(module, to_tier=True):
                    break
                sent.append(module)
            else:
                needed = self._bytes(back)
                if (self.seams.hbm_room(device) or 0) >= needed and self._move(back, to_tier=False):
                    return True
        except BaseException:
            self._return(sent)
            raise
        self._return(sent)
        return False

    def _return(self, sent: list[Any]) -> None:
        for module in reversed(sent):  # where HBM takes them
            self._move(module, to_tier=False)

    def _tier_bytes(self, module: Any) -> int:
        return sum(p.numel() * p.element_size() for p in self._params(module)
                   if self.seams.on_tier(p))  # fmt: skip

    def _move(self, module: Any, *, to_tier: bool) -> bool:
        """``module``'s parameters not there yet copied to the tier (``to_tier``) or to
        HBM; False where one could not be, those moved before it put back."""
        moved: list[tuple[Any, Any]] = []
        try:
            for p in self._params(module):
                if self.seams.on_tier(p) == to_tier:
                    continue
                copy = self.seams.to_tier(p.data) if to_tier else self._to_hbm(p.data)
                if copy is None:
                    break
                moved.append((p, p.data))
                p.data = copy
            else:
                return True
        except BaseException:
            self._put_back(moved)
            raise
        self._put_back(moved)
        return False

    @staticmethod
    def _put_back(moved: list[tuple[Any, Any]]) -> None:
        for p, own in reversed(moved):
            p.data = own

    def _to_hbm(self, t: Any) -> Any:
        return None if self.seams.to_hbm is None else self.seams.to_hbm(t)

    def _shares_weights(self, module: Any, modules: list[Any]) -> bool:
        """A parameter of ``module``'s is another module's too (a head tied to its
        embedding): moved apart, they would not be one tensor."""
        own = {id(p) for p in self._params(module)}
        return any(id(p) in own for m in modules if m is not module for p in self._params(m))

    def _off(self, why: str, *, expected: bool = False) -> None:
        """Off for good (its hooks leave at the next module call); a warning where
        weights on the tier stay read in place, else (training, nothing spilled) info."""
        self.state = "off"
        (log.info if expected else log.warning)("spilled weights read in place: %s", why)

    # -- the ring -----------------------------------------------------------------
    def _issue_ahead(self, place: int) -> None:
        """Copies issued, in order, for the modules from ``place`` to SLOTS - 1 after it
        (the next pass's first ones after the last): each slot is taken again only by
        the copy SLOTS after its last, whose reader has been called by then."""
        n = len(self._order)
        for k in range(min(SLOTS, n)):
            if (place + k) % n not in self._copied:
                self._issue((place + k) % n)

    def _issue(self, place: int) -> None:
        module = self._order[place]()
        if module is None:
            return
        slot = self._issued % SLOTS
        self._issued += 1
        buffer, offset = self._ring[slot], 0
        params = self._params(module)
        # after all the compute enqueued so far: the slot's last reader (the module
        # SLOTS copies back, called by now) and any write to these weights
        with self._on_copy_stream(self._record()):
            for p in params:
                n = p.numel() * p.element_size()
                buffer[offset : offset + n].copy_(p.data.reshape(-1).view(self.torch.uint8),
                                                  non_blocking=True)  # fmt: skip
                offset += _aligned(n)
            self._copied[place] = (slot, self._record(copy=True), _versions(params))

    def _restart(self) -> None:
        """A module called out of order: the copies in flight are dropped (waited for,
        so their slots are free) and the ring starts again from it."""
        for _, event, _ in self._copied.values():
            self._wait(event)
        self._copied.clear()

    # -- streams ------------------------------------------------------------------
    def _on_copy_stream(self, after: Any) -> Any:
        torch = self.torch
        if self.device_type != "cuda":
            return contextlib.nullcontext()
        if self._stream is None:
            self._stream = torch.cuda.Stream(self._device)
        self._stream.wait_event(after)
        return torch.cuda.stream(self._stream)

    def _record(self, copy: bool = False) -> Any:
        if self.device_type != "cuda":
            return None
        event = self.torch.cuda.Event()
        event.record(self._stream if copy else self.torch.cuda.current_stream(self._device))
        return event

    def _wait(self, event: Any) -> None:
        if event is not None:
            self.torch.cuda.current_stream(self._device).wait_event(event)

    # -- what a module holds ----------------------------------------------------------
    def _params(self, module: Any) -> list[Any]:
        """``module``'s own parameters that take memory on the streamed device type."""
        return [p for p in module.parameters(recurse=False)
                if p.device.type == self.device_type and p.numel() > 0]  # fmt: skip

    def _bytes(self, module: Any) -> int:
        return sum(_aligned(p.numel() * p.element_size()) for p in self._params(module))

    def _on_tier(self, module: Any) -> bool:
        """Its weight is on the tier: its largest parameter (a bias under the spill's
        smallest spilled allocation stays in HBM, and is copied with it)."""
        params = self._params(module)
        return bool(params) and self.seams.on_tier(max(params, key=lambda p: p.numel()))

    def _streamed(self, modules: list[Any], device: Any, on_tier: bool = True) -> list[Any]:
        """The modules to stream: those with parameters of their own (and no child's: a
        parent would hold its slot while its children's copies arrive) whose weight is on
        the tier (``on_tier`` False: or would be streamed there) and on ``device`` (None:
        any), embedding tables aside."""
        return [m for m in modules if self._big(m) and (self._on_tier(m) or not on_tier)
                and not _reads_rows(m) and not _children_hold_parameters(m)
                and (device is None or self._params(m)[0].device == device)]  # fmt: skip

    def _need(self, modules: list[Any], device: Any) -> int:
        """The ring's bytes: SLOTS of the largest module streamed."""
        return SLOTS * max((self._bytes(m) for m in self._streamed(modules, device)), default=0)

    def _in_hbm(self, module: Any) -> bool:
        return not any(self.seams.on_tier(p) for p in self._params(module))

    def _big(self, module: Any) -> bool:
        params = self._params(module)
        return bool(params) and all(p.is_contiguous() for p in params) and \
            sum(p.numel() * p.element_size() for p in params) >= SMALLEST  # fmt: skip

    def _runs_now(self) -> bool:
        torch = self.torch
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            return False
        if torch.utils._python_dispatch._get_current_dispatch_mode() is not None:
            return False
        return not (self.device_type == "cuda" and torch.cuda.is_current_stream_capturing())

    def remove(self) -> None:
        """Unhook (parameters swapped in a call under way are put back by its end)."""
        handles, self.handles = self.handles, []
        for h in handles:
            h.remove()


def _children_hold_parameters(module: Any) -> bool:
    return any(True for child in module.children() for _ in child.parameters())


def _reads_rows(module: Any) -> bool:
    """An embedding table: a call reads a few of its rows, cheaper in place than copied."""
    import torch

    return isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag))


def _versions(params: list[Any]) -> list[tuple[int, int]]:
    """Each parameter's version and storage: what a copy of them was made from."""
    return [(p._version, p.data_ptr()) for p in params]


def _aligned(n: int) -> int:
    return (n + 255) // 256 * 256


def install(torch: Any, seams: Seams, device_type: str = "cuda") -> WeightStreamer:
    """Hook every module's call, before and after (after also where it raises)."""
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    streamer = WeightStreamer(torch, seams, device_type)
    streamer.handles = [register_module_forward_pre_hook(streamer.before),
                        register_module_forward_hook(streamer.after, always_call=True)]  # fmt: skip
    return streamer
