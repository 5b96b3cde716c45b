"""Activations saved for the backward pass, sent to the tier when a step does not fit.

What spills by default is whatever asks when HBM has run out, and kernels then read and
write it over the link many times a step. An activation saved for the backward pass is
written once and read once: sent to the tier as the forward pass saves it and brought
back as the backward pass reaches it, it crosses the link twice a step and never sits
under a kernel there. So where a step spilled (HBM refused allocations the program made
in it), the next steps keep up to that many bytes of saved activations on the tier, the
first ones saved (the last the backward pass needs), and the activations in use stay in
HBM.

The means are PyTorch's own (``torch.autograd.graph.saved_tensors_hooks``, installed for
the process once a step has spilled: a script that fits never has them). Leaves
(parameters, inputs, buffers), views and expanded tensors, tensors under 1 MiB and those
on the tier already are saved as they are, and unpacked only if unchanged since: with
hooks installed, autograd leaves that check to them. The budget grows by what each
optimizer step spilled, by an eighth more; it does not shrink.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..base._lib import compiled
from ..base._log import get_logger

log = get_logger("pycxl.spill")
SMALLEST = 1 << 20  # smaller saved tensors stay: their trips cost more than they free
SAVED = compiled.USE_KINDS["saved_activations"]


def spilled_unplanned(figures: dict[str, tuple[int, int, int, int]]) -> int:
    """Bytes ever sent to the tier because HBM refused them (not placed there on purpose:
    optimizer state, saved activations)."""
    ever = figures["tier_bytes"][2] - figures["tier_state_bytes"][2]
    return ever - figures["tier_saved_bytes"][2]


def next_budget(budget: int, spilled_in_step: int) -> int:
    """Bytes of saved activations to keep on the tier once a step spilled
    ``spilled_in_step`` bytes with ``budget`` kept there."""
    return budget + spilled_in_step + spilled_in_step // 8 if spilled_in_step > 0 else budget


@dataclass
class _Kept:
    """A saved tensor left where it is, with its version when saved."""

    tensor: Any
    version: int


@dataclass
class _OnTier:
    """A saved tensor's copy on the tier, as the backward pass gets it back."""

    copy: Any


@dataclass
class SavedOffload:
    """The hooks of one spilling process; ``step_ended`` runs after each optimizer step."""

    torch: Any
    slot: int
    device: int = 0
    budget: int = 0  # bytes of saved activations kept on the tier at a time
    _unplanned_before: int = 0
    _hooks: list[Any] = field(default_factory=list)

    def step_ended(self) -> None:
        """Grow the budget by what the step spilled; install the hooks the first time."""
        figures, _ = compiled.tier_use(self.device)
        unplanned = spilled_unplanned(figures)
        spilled, self._unplanned_before = unplanned - self._unplanned_before, unplanned
        budget = next_budget(self.budget, spilled)
        log.info("optimizer step ended: %d bytes spilled in it", spilled)
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

    def pack(self, t: Any) -> Any:
        """A saved tensor: copied to the tier where worth it and in budget, else kept."""
        if not self._worth_sending(t):
            # kept with its version: with hooks installed autograd no longer checks that
            # a saved tensor was left unchanged, so unpack does
            return _Kept(t, t._version)
        before = (compiled.tier_prefer(self.slot), compiled.tier_kind(SAVED))
        try:
            copy = self.torch.empty_like(t)
        except RuntimeError:  # the tier is full too: keep it where it is
            return t
        finally:
            compiled.tier_prefer(before[0])
            compiled.tier_kind(before[1])
        copy.copy_(t)  # in the stream's order: t's memory is reused only after it
        return _OnTier(copy)

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
        back = self.torch.empty_like(packed.copy)  # in HBM (the spill's net below)
        back.copy_(packed.copy)
        return back
