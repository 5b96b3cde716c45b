"""One Adam or AdamW step over a parameter's state in flat memory: on the CPU by the
fused loop of native/adam.c (gradient in, fp32 master and moments updated, the weight
written back in the model's precision, one pass), or on the GPU by PyTorch's fused CUDA
kernel over state streamed into device memory.

``AdamSettings`` is an optimizer's param group, checked once where it enters (an
optimizer the tier cannot hold, an option it does not run, is refused there); the
steps take it as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...base.errors import InvalidRequestError
from .._import import import_torch


class AdamSteps:
    """Each updated parameter's Adam step count (torch's per-parameter ``step``), by the
    parameter: the one count both sides, the rest of the model and the state dict read."""

    def __init__(self, params: Iterable[Any] = ()) -> None:
        self._count = {id(p): 0 for p in params}

    def add(self, params: Iterable[Any]) -> None:
        """Count ``params`` too, from 0."""
        for p in params:
            self._count.setdefault(id(p), 0)

    def of(self, param: Any) -> int:
        """``param``'s steps so far."""
        return self._count[id(param)]

    def advance(self, params: Iterable[Any]) -> None:
        """``params`` take a step."""
        for p in params:
            self._count[id(p)] += 1

    def by_id(self) -> dict[int, int]:
        """Every count, by parameter id."""
        return dict(self._count)

    def load(self, counts: Mapping[int, int]) -> None:
        """The counts of ``counts`` (by parameter id) in place of this one's."""
        for ident in self._count.keys() & counts.keys():
            self._count[ident] = counts[ident]


@dataclass(frozen=True)
class AdamSettings:
    """The hyperparameters of one param group of Adam (``decoupled`` False) or AdamW."""

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    decoupled: bool
    maximize: bool
    grad_scale: float = 1.0  # the gradient's factor (a clip's coefficient, applied here)

    @classmethod
    def of(cls, optimizer: Any, group: Mapping[str, Any]) -> AdamSettings:
        """The settings of ``group`` of a torch Adam or AdamW ``optimizer``; anything
        else, or an option the offloaded step does not run, is refused by name."""
        torch = import_torch()
        if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
            raise InvalidRequestError(
                f"optimizer {type(optimizer).__name__}: the state of Adam and AdamW is "
                "placed on the tier; give torch.optim.Adam or torch.optim.AdamW"
            )
        if group.get("amsgrad"):
            raise InvalidRequestError(
                "amsgrad=True: its third moment is not offloaded; drop amsgrad or keep "
                "this optimizer off the tier"
            )
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            lr = float(lr.item())
        return cls.from_group(
            group, lr=float(lr), decoupled=isinstance(optimizer, torch.optim.AdamW)
        )

    @classmethod
    def now(cls, groups: Sequence[Mapping[str, Any]], decoupled: bool) -> list[AdamSettings]:
        """Each group's settings as they are now (a scheduler may move lr, and betas
        too), a tensor learning rate read as a number."""
        out = []
        for g in groups:
            lr = g["lr"]
            lr = float(lr.item()) if hasattr(lr, "item") else float(lr)
            out.append(cls.from_group(g, lr=lr, decoupled=decoupled))
        return out

    @classmethod
    def from_group(cls, group: Mapping[str, Any], *, lr: float, decoupled: bool) -> AdamSettings:
        """The settings of a param group whose class is already known (``decoupled``)."""
        b1, b2 = (float(b) for b in group["betas"])
        settings = cls(
            lr=lr,
            betas=(b1, b2),
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            decoupled=decoupled,
            maximize=bool(group.get("maximize", False)),
        )
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0) or settings.eps < 0 or lr < 0:
            raise InvalidRequestError(
                f"Adam settings lr={lr} betas={group['betas']} eps={group['eps']}: give "
                "lr >= 0, betas in [0, 1) and eps >= 0"
            )
        return settings


def precision_kind(dtype: Any) -> int:
    """native/adam.c's code for a gradient's or weight's dtype."""
    from ...base._lib.compiled import ADAM_KINDS

    kind = ADAM_KINDS.get(str(dtype).removeprefix("torch."))
    if kind is None:
        raise InvalidRequestError(
            f"{dtype}: the offloaded Adam step reads and writes float32, bfloat16 and "
            "float16 parameters"
        )
    return kind


class CpuAdam:
    """The fused CPU step on a team of threads pinned to ``cpus`` (the tier's socket)."""

    def __init__(self, cpus: Sequence[int]) -> None:
        from ...base._lib.compiled import AdamTeam

        if not cpus:
            raise InvalidRequestError("the CPU Adam step needs at least one CPU")
        self.team = AdamTeam(cpus)

    @property
    def cpus(self) -> tuple[int, ...]:
        """The CPUs its threads are pinned to."""
        return self.team.cpus

    def step(
        self,
        state: tuple[Any, Any, Any],
        grad: Any,
        weight: Any | None,
        step: int,
        settings: AdamSettings,
        grad_scale: float = 1.0,
    ) -> None:
        """Update ``state`` (master, exp_avg, exp_avg_sq: contiguous fp32 CPU tensors of
        one size) from ``grad`` (a contiguous CPU tensor of that size, fp32, bf16 or
        fp16) times ``grad_scale``, writing the new weights into ``weight`` (its
        precision; None when the master is the weight) at step number ``step``."""
        from ...base._lib.compiled import ADAM_NO_WEIGHT

        master, m, v = state
        n = master.numel()
        if grad.numel() != n or (weight is not None and weight.numel() != n):
            raise InvalidRequestError(f"a gradient or weight of another size than {n}")
        self.team.step(
            n,
            master.data_ptr(),
            m.data_ptr(),
            v.data_ptr(),
            None,
            grad.data_ptr(),
            precision_kind(grad.dtype),
            None if weight is None else weight.data_ptr(),
            ADAM_NO_WEIGHT if weight is None else precision_kind(weight.dtype),
            lr=settings.lr,
            betas=settings.betas,
            eps=settings.eps,
            weight_decay=settings.weight_decay,
            decoupled=settings.decoupled,
            maximize=settings.maximize,
            step=step,
            grad_scale=grad_scale * settings.grad_scale,
        )

    def accumulate(self, home: Any, incoming: Any, add: bool) -> float:
        """``home += incoming`` (``add``) or ``home = incoming``, for contiguous CPU
        tensors of one size and precision (fp32, bf16, fp16), rounded as ``add_`` rounds;
        returns the sum of the squares of ``home`` after (its norm, squared)."""
        if home.numel() != incoming.numel() or home.dtype != incoming.dtype:
            raise InvalidRequestError(
                f"a gradient of {incoming.numel()} {incoming.dtype} added onto "
                f"{home.numel()} {home.dtype}: they must match"
            )
        kind = precision_kind(home.dtype)
        return self.team.accumulate(home.numel(), home.data_ptr(), incoming.data_ptr(), kind, add)

    def close(self) -> None:
        """Stop the threads."""
        self.team.close()


def gpu_adam_step(
    masters: list[Any],
    grads: list[Any],
    exp_avgs: list[Any],
    exp_avg_sqs: list[Any],
    step: Any,
    settings: AdamSettings,
) -> None:
    """PyTorch's fused CUDA Adam/AdamW over fp32 device tensors (``grads`` fp32 too),
    at step number ``step`` (a float32 device tensor, one for all)."""
    torch = import_torch()
    fused = torch._fused_adamw_ if settings.decoupled else torch._fused_adam_
    fused(
        masters,
        grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        [step] * len(masters),
        lr=settings.lr,
        beta1=settings.betas[0],
        beta2=settings.betas[1],
        weight_decay=settings.weight_decay,
        eps=settings.eps,
        amsgrad=False,
        maximize=settings.maximize,
        grad_scale=None,
        found_inf=None,
    )
