"""The 2-norms of streamed gradients, taken on the device as each block's gradients leave
for home, so that clipping by global norm (clipping.py) reads no gradient on the tier.

A backward pass's norms stand for the gradients it made. They are kept when it ends if
no gradient was added onto an earlier micro-batch's (the norm of a sum is not known from
its parts: such a step's norm is taken the usual way), and each only while its home
gradient keeps the version it had then (changed in place since, or replaced: taken the
usual way). Per gradient and in its dtype, as ``torch.nn.utils.clip_grad_norm_`` takes
them, so the total comes out as PyTorch's does.
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
        self._pass: dict[int, tuple[Any, Any]] = {}  # parameter id -> (norm, home view)
        self._added = False  # this pass added gradients onto an earlier micro-batch's
        self._kept: dict[int, _Norm] = {}

    def sent(self, params: list[Any], grads: list[Any], homes: list[Any], adding: bool) -> None:
        """A block's gradients ``grads`` (on the device, of ``params``) leave for
        ``homes``, added onto what is there (``adding``) or in its place."""
        if adding:
            self._added = True
        if self._added or not grads:
            return
        norms = import_torch()._foreach_norm(grads, 2.0)
        for p, norm, home in zip(params, norms, homes, strict=True):
            self._pass[id(p)] = (norm, home)

    def pass_ended(self) -> None:
        """The backward pass ended with every gradient home: its norms are kept (none
        where it added gradients)."""
        pass_, added = self._pass, self._added
        self._pass, self._added = {}, False
        if added:
            self._kept = {}
            return
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
        self._pass, self._added, self._kept = {}, False, {}
