"""Where a spilling process's optimizer state goes: HBM while the step fits, else the tier.

An optimizer makes its state inside its first ``step()``, after a forward and a backward
pass have shown the step's peak. What spills by default is whatever asks when HBM runs
out (activations, which kernels read and write many times a step); the state is touched
once a step. So at a step that will make state, the placement asks: would the next
step's peak (this process's peak so far plus the state) fit in what the process holds of
HBM plus the room left? If not, the state is made on the tier, where the optimizer's
kernels update it in place over the link, and HBM keeps the activations.

It hooks every optimizer through torch's global step hooks (``torch.optim.optimizer``'s
``register_optimizer_step_pre_hook`` and ``_post_hook``): the script is unchanged.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..base._lib import compiled
from ..base._log import get_logger
from ..base.errors import NotAvailableError
from .spill_saved import SavedOffload

log = get_logger("pycxl.spill")

# state bytes per parameter byte that each optimizer makes (torch.optim's own); others
# are taken as Adam's two moments, the common case and the larger
STATE_PER_PARAM = {
    "Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2, "Adadelta": 2,
    "Adagrad": 1, "RMSprop": 1, "Rprop": 2, "ASGD": 1, "SGD": 1, "SparseAdam": 2,
}  # fmt: skip
DEFAULT_STATE_PER_PARAM = 2


def state_bytes_to_make(optimizer: Any) -> tuple[int, Any]:
    """Bytes of the state ``optimizer``'s next step will make (for parameters with a
    gradient and no state yet), and the device of the first such parameter (None: no
    state to make)."""
    name = type(optimizer).__name__
    per = STATE_PER_PARAM.get(name, DEFAULT_STATE_PER_PARAM)
    total, device = 0, None
    for group in optimizer.param_groups:
        if name == "SGD" and not group.get("momentum"):
            continue
        extra = 1 if group.get("amsgrad") else 0
        for p in group["params"]:
            if p.grad is None or optimizer.state.get(p):
                continue
            total += (per + extra) * p.numel() * p.element_size()
            device = p.device if device is None else device
    return total, device


def state_belongs_on_tier(peak: int, state: int, held_in_hbm: int, room: int,
                          headroom: int) -> bool:  # fmt: skip
    """Whether a step whose peak so far is ``peak`` bytes would outgrow HBM with ``state``
    more bytes in it: the process holds ``held_in_hbm`` and can take ``room`` more, less
    the ``headroom`` the libraries keep."""
    return peak + state > held_in_hbm + room - headroom


@dataclass
class Placement:
    """Installed once per spilling process: the step hooks and what they decided."""

    torch: Any
    slot: int
    headroom: int
    saved: SavedOffload | None = None  # told of each step's end
    state_on_tier: int = 0  # bytes of state the hooks sent to the tier
    state_in_hbm: int = 0
    steps: int = 0  # optimizer steps ended (every optimizer's)
    # optimizer id -> the thread's slot and kind before its step steered them: one
    # entry per optimizer (a wrapper's step runs its inner optimizer's inside)
    _before: dict[int, tuple[int, int]] = field(default_factory=dict)
    handles: list[Any] = field(default_factory=list)

    def remove(self) -> None:
        """Unhook the optimizers' steps."""
        for h in self.handles:
            h.remove()
        self.handles = []

    def _restore(self, optimizer: Any) -> None:
        before = self._before.pop(id(optimizer), None)
        if before is not None:
            compiled.tier_prefer(before[0])
            compiled.tier_kind(before[1])

    def pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Before a step: where it will make state, decide where that state goes."""
        self._restore(optimizer)  # a step that raised never reached its post hook
        state, where = state_bytes_to_make(optimizer)
        if where is None or where.type != "cuda" or state == 0:
            return
        device = where.index if where.index is not None else 0
        self.torch.cuda.synchronize(device)  # once per optimizer, at its first step
        figures, lifetime_peak = compiled.tier_use(device)
        room = compiled.tier_hbm_room(device, settle=True)
        held = figures["hbm_bytes"][0]
        if room is None or not state_belongs_on_tier(lifetime_peak, state, held, room,
                                                     self.headroom):  # fmt: skip
            log.info("optimizer state (%d bytes) made in HBM: the step's peak %d plus it fits "
                     "the %s bytes of HBM held and free", state, lifetime_peak,
                     "unknown" if room is None else held + room)  # fmt: skip
            self.state_in_hbm += state
            return
        log.info("optimizer state (%d bytes) made on the tier: the step's peak %d plus it "
                 "passes the %d bytes of HBM held and free", state, lifetime_peak,
                 held + room)  # fmt: skip
        self.state_on_tier += state
        self._before[id(optimizer)] = (compiled.tier_prefer(self.slot),
            compiled.tier_kind(compiled.USE_KINDS["optimizer_state"]))  # fmt: skip

    def post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """After a step: the thread's allocations as before, the step's spill told."""
        self._restore(optimizer)
        self.steps += 1
        where = next((p.device for g in optimizer.param_groups for p in g["params"]
                      if p.is_cuda), None)  # fmt: skip
        if self.saved is not None and where is not None:
            self.saved.device = where.index if where.index is not None else 0
            self.saved.step_ended()


def install(torch: Any, slot: int, headroom: int) -> Placement:
    """Hook every optimizer's step (``placement.remove()`` unhooks)."""
    opt = importlib.import_module("torch.optim.optimizer")
    pre: Callable[..., Any] | None = getattr(opt, "register_optimizer_step_pre_hook", None)
    post: Callable[..., Any] | None = getattr(opt, "register_optimizer_step_post_hook", None)
    if pre is None or post is None:
        raise NotAvailableError(
            f"spilling needs torch's global optimizer step hooks (PyTorch 2.0 or later); "
            f"this is PyTorch {torch.__version__}: upgrade it"
        )
    placement = Placement(torch, slot, headroom, saved=SavedOffload(torch, slot))
    placement.handles = [pre(placement.pre), post(placement.post)]
    return placement
