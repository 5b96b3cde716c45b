"""The 2-norms of streamed gradients, taken on the device as each block's gradients leave
for home, so that clipping by global norm (clipping.py) reads no gradient on the tier.

A backward pass's norms stand for the gradients it made. A gradient added onto an earlier
micro-batch's at home has the norm of the sum, which is not known from its parts: the
threads that add it take it in the same pass (``summed``); where torch added them
(``lost``), the step's norms are taken the usual way. Each is kept only while its home
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

    def __init__(self, device: Any) -> None:
        self._device = device  # where the norms are handed out, as the device's are
        self._pass: dict[int, tuple[Any, Any]] = {}  # parameter id -> (norm, home view)
        # parameter id -> (sum of squares, home view): sums made at home this pass
        self._sums: dict[int, tuple[float, Any]] = {}
        self._lost = False  # this pass added gradients whose norms were not taken
        self._kept: dict[int, _Norm] = {}

    def sent(self, params: list[Any], grads: list[Any], homes: list[Any], adding: bool) -> None:
        """A block's gradients ``grads`` (on the device, of ``params``) leave for
        ``homes``, added onto what is there (``adding``: the sum's norm comes from
        ``summed``) or in its place."""
        if adding or not grads:
            return
        norms = import_torch()._foreach_norm(grads, 2.0)
        for p, norm, home in zip(params, norms, homes, strict=True):
            self._pass[id(p)] = (norm, home)

    def summed(self, param: Any, sumsq: float, home: Any) -> None:
        """``param``'s gradient at ``home`` was made there (an earlier micro-batch's plus
        this one's, or this one's alone) and the sum of its squares taken: ``sumsq``."""
        self._sums[id(param)] = (sumsq, home)

    def lost(self) -> None:
        """This pass added gradients at home whose norms were not taken."""
        self._lost = True

    def pass_ended(self) -> None:
        """The backward pass ended with every gradient home: its norms are kept (none
        where some were lost)."""
        pass_, sums, lost = self._pass, self._sums, self._lost
        self._pass, self._sums, self._lost = {}, {}, False
        if lost:
            self._kept = {}
            return
        pass_.update(self._to_device(sums))
        # a parameter this pass gave no gradient keeps an earlier one: not kept here
        self._kept = {i: _Norm(n, home, home._version) for i, (n, home) in pass_.items()}

    def _to_device(self, sums: dict[int, tuple[float, Any]]) -> dict[int, tuple[Any, Any]]:
        """The sums' norms as 0-d tensors in their gradients' dtypes on the device, one
        copy for each dtype (as the device's norms are: the clip stacks them there)."""
        torch = import_torch()
        by_dtype: dict[Any, list[int]] = {}
        for i, (_, home) in sums.items():
            by_dtype.setdefault(home.dtype, []).append(i)
        out = {}
        for dtype, ids in by_dtype.items():
            squares = torch.tensor([sums[i][0] for i in ids], dtype=torch.float64)
            norms = squares.sqrt().to(dtype).to(self._device)
            for i, norm in zip(ids, norms.unbind(), strict=True):
                out[i] = (norm, sums[i][1])
        return out

    def of(self, param: Any) -> Any | None:
        """The 2-norm of ``param.grad`` (a 0-d device tensor), where it is the last
        pass's, unchanged since; None where it must be taken the usual way."""
        kept = self._kept.get(id(param))
        if kept is None or param.grad is not kept.home or kept.home._version != kept.version:
            return None
        return kept.norm

    def forget(self) -> None:
        """The gradients were cleared or a pass broke off: nothing is known."""
        self._pass, self._sums, self._lost, self._kept = {}, {}, False, {}
