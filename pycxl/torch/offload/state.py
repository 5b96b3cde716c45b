"""A model offload's optimizer state as PyTorch saves it: by parameter index, fp32 tensors
copied off the tier, each parameter's fp32 master beside its moments; loaded back into
the tier's memory (and the model's weights) after checking it fits this model."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...base.errors import InvalidRequestError
from .._import import import_torch
from .adam import AdamSteps
from .layout import Block
from .rest import Entry, RestUpdate

_SAVED = {"exp_avg", "exp_avg_sq", "master", "step"}


def entries(blocks: Iterable[Block], rest: RestUpdate) -> list[Entry]:
    """(param, master, exp_avg, exp_avg_sq) of every parameter, blocks' first; a block's
    are views of its state on the tier."""
    out = []
    for B in blocks:
        for p in B.params:
            out.append((p.param, *(B.part(B.state, k, p).view(p.shape) for k in range(3))))
    return out + list(rest.entries)


def master_of(blocks: Iterable[Block], rest: RestUpdate, param: Any) -> Any:
    """The fp32 master copy of ``param`` (a block's: a view of the tier's memory)."""
    for p, master, _, _ in entries(blocks, rest):
        if p is param:
            return master
    raise InvalidRequestError("not a parameter this offload updates")


def state_dict(
    blocks: list[Block],
    rest: RestUpdate,
    steps: AdamSteps,
    groups: list[dict[str, Any]],
    base: dict[str, Any],
) -> dict[str, Any]:
    """The state as torch's Adam saves it, over the optimizer's ``groups``; ``base``: the
    optimizer's own (its param_groups)."""
    torch = import_torch()
    index = {id(p): i for i, p in enumerate(p for g in groups for p in g["params"])}
    state = {}
    for p, master, a, b in entries(blocks, rest):
        state[index[id(p)]] = {
            "step": torch.tensor(float(steps.of(p))),
            "exp_avg": a.detach().cpu().clone(),
            "exp_avg_sq": b.detach().cpu().clone(),
            "master": master.detach().cpu().clone(),
        }
    return {"state": state, "param_groups": base["param_groups"]}


def checked(
    blocks: list[Block], rest: RestUpdate, groups: list[dict[str, Any]], saved: dict[str, Any]
) -> list[tuple[Entry, dict[str, Any]]]:
    """Each parameter's entry beside its saved state, every one checked before any is
    loaded: a state dict of another optimizer or model is refused by name."""
    params = [p for g in groups for p in g["params"]]
    by_param = saved.get("state", {})
    mine = {id(e[0]): e for e in entries(blocks, rest)}
    out = []
    for i, p in enumerate(params):
        if id(p) not in mine:
            continue
        st = by_param.get(i)
        if st is None or not st.keys() >= _SAVED:
            raise InvalidRequestError(
                f"the state dict has no master and moments for parameter {i}: load one "
                "saved by this optimizer"
            )
        for key in ("master", "exp_avg", "exp_avg_sq"):
            if tuple(st[key].shape) != tuple(p.shape):
                raise InvalidRequestError(
                    f"parameter {i}: saved {key} of shape {tuple(st[key].shape)}, the "
                    f"model's {tuple(p.shape)}: load a state dict of this model"
                )
        out.append((mine[id(p)], st))
    return out


def load(loaded: list[tuple[Entry, dict[str, Any]]], steps: AdamSteps) -> None:
    """The checked state into the tier's memory and the weights, each parameter's step
    count from it."""
    torch = import_torch()
    with torch.no_grad():
        for (p, master, a, b), st in loaded:
            master.copy_(st["master"])
            a.copy_(st["exp_avg"])
            b.copy_(st["exp_avg_sq"])
            p.data.copy_(master.view(p.shape))
    steps.load({id(e[0]): int(st["step"]) for e, st in loaded})


def follow_weights(blocks: Iterable[Block], rest: RestUpdate) -> None:
    """The fp32 masters set from the model's weights (after they were loaded)."""
    torch = import_torch()
    with torch.no_grad():
        for B in blocks:
            for p in B.params:
                B.part(B.state, 0, p).copy_(p.param.detach().reshape(-1))
        rest.follow_weights()


def host_tensors(blocks: Iterable[Block]) -> list[Any]:
    """The host memory on the tier: each block's state, and its gradients and weights
    where they are kept there."""
    out = []
    for B in blocks:
        out += [t for t in (B.state, B.grads, B.weights, B.incoming)
                if t is not None and t.device.type == "cpu"]  # fmt: skip
    return out
