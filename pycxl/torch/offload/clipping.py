"""Clipping by global norm with no pass over gradients on the tier.

While a streamed ``offload_model`` is open, ``torch.nn.utils.clip_grad_norm_`` (what
accelerate, the Trainer and Lightning call) is this module's: for its blocks'
parameters the norm is the one taken on the device as their gradients left for home
(grad_norms.py), and the clip coefficient is applied inside the update (a scale on the
gradient the Adam step reads) instead of by another pass over them; every other
parameter is clipped in place, as PyTorch clips it. The total and the update are
PyTorch's (the coefficient is applied in fp32, not after rounding to the gradient's
dtype); the blocks' ``.grad`` read after clipping are the unclipped ones. A block's norm
that is not known (gradients summed over micro-batches, a gradient changed since its
pass) is taken here as PyTorch takes it, its coefficient still applied in the update;
another norm type is clipped the usual way. (Taking the sums' norms in the thread that
adds them was tried: on an H100 host it made a 4-micro-batch step 1.8x slower, the
adds and norms of every micro-batch on one thread, against one norm pass here.)
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from ...base.errors import InvalidRequestError
from .._import import import_torch
from .grad_norms import GradNorms
from .layout import Block

# the open offloads (weakly: one dropped unclosed is forgotten), and torch's function
# while ours is in its place
_owners: list[weakref.ref[ClipInUpdate]] = []
_original: list[Callable[..., Any]] = []
_lock = threading.Lock()


def install(owner: ClipInUpdate) -> None:
    """``owner``'s parameters are clipped in its update from now on."""
    torch = import_torch()
    with _lock:
        if not _original:
            _original.append(torch.nn.utils.clip_grad_norm_)
            torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
            torch.nn.utils.clip_grad.clip_grad_norm_ = clip_grad_norm_
        _owners.append(weakref.ref(owner))


def remove(owner: ClipInUpdate | None) -> None:
    """``owner`` closed (None: only those dropped are forgotten): the last one puts
    torch's function back."""
    torch = import_torch()
    with _lock:
        _owners[:] = [r for r in _owners if r() is not None and r() is not owner]
        if not _owners and _original:
            original = _original.pop()
            torch.nn.utils.clip_grad_norm_ = original
            torch.nn.utils.clip_grad.clip_grad_norm_ = original


def _live() -> list[ClipInUpdate]:
    owners = [o for o in (r() for r in _owners) if o is not None]
    if len(owners) < len(_owners):
        remove(None)
    return owners


def _known(params: list[Any], norm_type: float) -> dict[int, tuple[ClipInUpdate, Any]]:
    """The offloads' parameters among ``params``, each with its owner and its
    gradient's norm: the one taken as it left, or, where none was, taken here as
    PyTorch takes it (the coefficient still goes to the update: no pass to scale)."""
    owners = _live()
    if norm_type != 2.0 or not owners:
        return {}
    found = {}
    unknown: list[tuple[ClipInUpdate, Any]] = []
    for p in params:
        if p.grad is None:
            continue
        owner = next((o for o in owners if o.owns(p)), None)
        if owner is None:
            continue
        norm = owner.norm_of(p)
        if norm is None:
            unknown.append((owner, p))
        else:
            found[id(p)] = (owner, norm)
    norms = _norms([p.grad for _, p in unknown])
    for (owner, p), norm in zip(unknown, norms, strict=True):
        found[id(p)] = (owner, owner.as_updated(p, norm))
    return found


def _norms(tensors: list[Any]) -> list[Any]:
    """Each tensor's 2-norm, one ``_foreach_norm`` per device and dtype, in their order."""
    torch = import_torch()
    out: dict[int, Any] = {}
    for group in _by_device_and_dtype(tensors):
        for t, n in zip(group, torch._foreach_norm(group, 2.0), strict=True):
            out[id(t)] = n
    return [out[id(t)] for t in tensors]


def clip_grad_norm_(
    parameters: Any,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Any:
    """``torch.nn.utils.clip_grad_norm_``, with the offload's known norms read and its
    coefficient applied in its update (the module's text says how)."""
    torch = import_torch()
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    original = _original[0] if _original else torch.nn.utils.clip_grad_norm_
    known = _known(params, float(norm_type))
    if not known:
        return original(params, max_norm, norm_type, error_if_nonfinite, foreach)
    with torch.no_grad():
        grads = [p.grad for p in params if p.grad is not None]
        others = [p.grad for p in params if p.grad is not None and id(p) not in known]
        # in the order given, each time given: a parameter listed twice counts twice
        norms = [known[id(p)][1] for p in params if p.grad is not None and id(p) in known]
        for group in _by_device_and_dtype(others):
            norms.extend(torch._foreach_norm(group, 2.0))
        first = grads[0].device
        total = torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), 2.0)
        if error_if_nonfinite and not math.isfinite(float(total)):
            raise RuntimeError(
                f"The total norm of order {float(norm_type)} for gradients from "
                "`parameters` is non-finite, so it cannot be clipped. To disable this "
                "error and scale the gradients by the non-finite norm anyway, set "
                "`error_if_nonfinite=False`"
            )
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for group in _by_device_and_dtype(others):
            torch._foreach_mul_(group, coefficient.to(group[0].device))
        by_owner: dict[int, tuple[ClipInUpdate, list[Any]]] = {}
        for p in params:
            if id(p) in known:
                owner = known[id(p)][0]
                by_owner.setdefault(id(owner), (owner, []))[1].append(p)
        for owner, mine in by_owner.values():
            owner.scale_in_update(mine, coefficient)
    return total


def _by_device_and_dtype(tensors: Iterable[Any]) -> list[list[Any]]:
    groups: dict[tuple[Any, Any], list[Any]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return list(groups.values())


class ClipInUpdate:
    """A streamed offload's side of the clip: its blocks' norms (taken as their
    gradients left, ``norms``), and the coefficients a clip left for its update, by
    parameter (a second clip compounds, as clipping twice in place does)."""

    def __init__(self, blocks: list[Block], norms: GradNorms) -> None:
        self._blocks = blocks
        self._norms = norms
        self._where = {id(p.param): (k, j) for k, B in enumerate(blocks)
                       for j, p in enumerate(B.params)}  # fmt: skip
        self._pending: dict[int, list[Any]] = {}  # parameter id -> coefficients
        self._homes: dict[int, tuple[Any, int]] = {}  # parameter id -> (home, version)

    @property
    def pending(self) -> bool:
        """A clip left coefficients for the next update."""
        return bool(self._pending)

    def owns(self, param: Any) -> bool:
        """``param`` is one of this offload's blocks' (its coefficient goes to the update)."""
        return id(param) in self._where

    def norm_of(self, param: Any) -> Any | None:
        """The 2-norm of ``param.grad`` as the update will read it (a 0-d tensor), or
        None where it is not known here."""
        norm = self._norms.of(param)
        return None if norm is None else self.as_updated(param, norm)

    def as_updated(self, param: Any, norm: Any) -> Any:
        """``norm``, of ``param.grad``, as the update will read the gradient: times the
        coefficients an earlier clip left for it."""
        for c in self._pending.get(id(param), []):
            norm = norm * c.to(norm.device)
        return norm

    def scale_in_update(self, params: list[Any], coefficient: Any) -> None:
        """``params``' gradients scaled by ``coefficient`` (a 0-d tensor) in the update."""
        for p in params:
            self._pending.setdefault(id(p), []).append(coefficient)
            self._homes[id(p)] = (p.grad, p.grad._version)

    def clear(self) -> None:
        """The gradients were cleared: their coefficients with them."""
        self._pending, self._homes = {}, {}

    def take(self) -> dict[int, float]:
        """At step(): each block's scale on its gradients (by ``Block.index``), the
        record cleared. A block whose parameters were clipped apart (different
        coefficients) is scaled in place here; a gradient changed or replaced since the
        clip is refused (its update could not be PyTorch's)."""
        torch = import_torch()
        pending, homes = self._pending, self._homes
        self.clear()
        if not pending:
            return {}
        values: dict[int, float] = {}  # coefficient tensor id -> its value

        def scale_of(param: Any) -> float:
            scale = 1.0
            for c in pending.get(id(param), []):
                if id(c) not in values:
                    values[id(c)] = float(c)
                scale *= values[id(c)]
            return scale

        for i, (home, version) in homes.items():
            k, j = self._where[i]
            param = self._blocks[k].params[j].param
            if param.grad is not home or home._version != version:
                raise InvalidRequestError(
                    f"a gradient of block {self._blocks[k].index} changed after "
                    "clip_grad_norm_ (its coefficient is applied in the update): clip "
                    "after the last backward pass and change no gradient until step()"
                )
        scales = {}
        for B in self._blocks:
            live = [p.param for p in B.params if p.param.grad is not None]
            if not any(id(p) in pending for p in live):
                continue
            each = [scale_of(p) for p in live]
            if len(set(each)) == 1:
                scales[B.index] = each[0]
                continue
            with torch.no_grad():  # clipped apart: in place, as PyTorch would have
                for p, s in zip(live, each, strict=True):
                    if s != 1.0:
                        p.grad.mul_(s)
        return scales
