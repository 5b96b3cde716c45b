"""The 2-norms of streamed gradients, taken on the device as each block's gradients leave
for home, so that clipping by global norm (clipping.py) reads no gradient on the tier.

A backward pass's norms stand for the gradients it leaves in ``.grad``: those it made,
taken on the device as they leave, or, where they were added onto an earlier
micro-batch's (the norm of a sum is not known from its parts), the sums', taken at home
by the thread that adds them, beside the backward pass. Each is kept only while its home
gradient keeps the version it had when the pass ended (changed in place since, or
replaced: taken the usual way). Per gradient and in its dtype, as
``torch.nn.utils.clip_grad_norm_`` takes them, so the total comes out as PyTorch's does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._import import import_torch


@dataclass(frozen=True)
class _Norm:
    norm: Any  # a 0-d tensor on the device
    home: Any  # the parameter's home gradient (its ``.grad`` after the pass)
    version: int  # the home gradient's version when the pass ended


class GradNorms:
    """The norms of the gradients of the backward pass under way, and of the last one
    that ended; a parameter's norm is known while its ``.grad`` is that pass's."""

    def __init__(self) -> None:
        # parameter id -> (norm, home view); written by the adder thread too (one key
        # each, under the GIL), read once the pass has ended and the adds are done
        self._pass: dict[int, tuple[Any, Any]] = {}
        self._kept: dict[int, _Norm] = {}

    def sent(self, params: list[Any], grads: list[Any], homes: list[Any], adding: bool) -> None:
        """A block's gradients ``grads`` (on the device, of ``params``) leave for
        ``homes``, added onto what is there (``adding``: ``added`` takes the sums'
        norms once they are made) or in its place."""
        if adding or not grads:
            return
        norms = import_torch()._foreach_norm(grads, 2.0)
        for p, norm, home in zip(params, norms, homes, strict=True):
            self._pass[id(p)] = (norm, home)

    def added(self, params: list[Any], homes: list[Any]) -> None:
        """``homes`` (of ``params``, on the host) now hold the sums of this pass's
        gradients and the earlier ones': their norms (the adder thread's)."""
        if not homes:
            return
        norms = import_torch()._foreach_norm(homes, 2.0)
        for p, norm, home in zip(params, norms, homes, strict=True):
            self._pass[id(p)] = (norm, home)

    def pass_ended(self) -> None:
        """The backward pass ended with every gradient home and every sum made: its
        norms are kept."""
        pass_, self._pass = self._pass, {}
        # a parameter this pass gave no gradient keeps an earlier one: not kept here
        self._kept = {i: _Norm(n, home, home._version) for i, (n, home) in pass_.items()}

    def of(self, param: Any) -> Any | None:
        """The 2-norm of ``param.grad`` (a 0-d device tensor), where it is the last
        pass's, unchanged since; None where it must be taken the usual way."""
        kept = self._kept.get(id(param))
        if kept is None or param.grad is not kept.home or kept.home._version != kept.version:
            return None
        return kept.norm

    def forget(self) -> None:
        """The gradients were cleared or a pass broke off: nothing is known."""
        self._pass, self._kept = {}, {}
