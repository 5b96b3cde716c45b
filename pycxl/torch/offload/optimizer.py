"""``TierOptimizer``: the torch.optim.Optimizer a model offload hands its user, so
schedulers, GradScaler and the loop's habits take it; its step, zero_grad and state are
the offload's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ...base.errors import InvalidRequestError
from .._import import import_torch


class Steps(Protocol):
    """What the optimizer asks of its offload (the offload's own, not its user's)."""

    def _check_open(self) -> None:
        """Refuse a closed offload."""

    def _step(self, groups: list[dict[str, Any]]) -> None:
        """The step over ``groups``."""

    def synchronize(self) -> None:
        """Wait for the update in flight."""

    def _unstepped(self) -> None:
        """Hear of gradients cleared."""

    def _state_dict(self, base: dict[str, Any]) -> dict[str, Any]:
        """The optimizer's state."""

    def _load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a saved state."""


def optimizer_class() -> type:
    """``TierOptimizer``, made once torch is imported."""
    torch = import_torch()

    class TierOptimizer(torch.optim.Optimizer):  # type: ignore[misc,name-defined]
        """Adam or AdamW over a model whose blocks' state is on a tier: ``step()``
        updates every parameter (see pycxl.torch.offload.model); ``param_groups`` are the
        ones given, so a scheduler's learning rate is the one used."""

        def __init__(
            self, offload: Steps, groups: list[dict[str, Any]], defaults: dict[str, Any]
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
