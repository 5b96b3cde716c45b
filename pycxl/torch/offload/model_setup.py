"""``offload_model``'s set-up, before any step: the optimizer's param groups checked and
mapped, the model where its mode needs it (on the device, or streamed: all but the
blocks' parameters there), and each block's state, gradients and weights placed in host
memory on the tier."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...base.errors import InvalidRequestError
from .._import import import_torch
from .adam import AdamSettings
from .checkpoint import place
from .config import OffloadConfig
from .host_memory import HostAlloc
from .layout import Block, ParamSlot, piece


def param_groups(model: Any, base: Any) -> tuple[dict[int, int], list[dict[str, Any]]]:
    """Each parameter's group in the optimizer ``base`` (by id), and the groups, their
    settings checked once here: refused by name where the optimizer and the model do
    not hold the same parameters."""
    known = {id(p) for p in model.parameters()}
    group_of: dict[int, int] = {}
    groups = []
    for g, group in enumerate(base.param_groups):
        AdamSettings.of(base, group)  # refused here, not at the first step
        for p in group["params"]:
            if id(p) not in known:
                raise InvalidRequestError("the optimizer holds a parameter the model has not")
            group_of[id(p)] = g
        groups.append(dict(group))
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in group_of]
    if missing:
        raise InvalidRequestError(
            f"the optimizer does not update {missing[0]} (and {len(missing) - 1} more): "
            "give it all the model's trainable parameters"
        )
    return group_of, groups


def check_on_device(model: Any, device: Any) -> None:
    """Resident: every parameter already on ``device``, or refused by name."""
    for name, p in model.named_parameters():
        if p.device != device:
            raise InvalidRequestError(
                f"{name} is on {p.device}, not {device}: move the model there "
                "first (model.to(device)), or stream its blocks (weights='stream')"
            )


def check_not_meta(model: Any) -> None:
    """A model on the ``meta`` device has no values to train: refused by name."""
    for name, p in model.named_parameters():
        if p.is_meta:
            raise InvalidRequestError(
                f"{name} is on the meta device (no values): give offload_model its "
                "checkpoint (weights_from=folder or file.safetensors), let it initialise "
                "the model (initialise=True), or build the model on a real device"
            )


def move_rest(model: Any, in_blocks: set[int], device: Any) -> None:
    """Streamed: what is not a block's parameter (embeddings, norm, head, every buffer)
    onto ``device``; the blocks' parameters go home (the ferry takes them)."""
    torch = import_torch()
    with torch.no_grad():
        for p in model.parameters():
            if id(p) not in in_blocks and p.device != device:
                p.data = p.data.to(device)
        for module in model.modules():
            for name, buf in module._buffers.items():
                if buf is not None and buf.device != device:
                    module._buffers[name] = buf.to(device)


def check_hbm_room(blocks: list[Block], config: OffloadConfig) -> None:
    """Refused by name, before any is taken, where ``config.hbm_blocks`` is more blocks
    than there are, or their state (streamed: and their weights and gradients, which
    stay on the device) more than the device has free."""
    n = config.hbm_blocks
    if not n:
        return
    if n > len(blocks):
        raise InvalidRequestError(
            f"hbm_blocks {n}: the model has {len(blocks)} blocks; give {len(blocks)} or fewer"
        )
    need = sum(12 * B.numel for B in blocks[:n])
    if config.streamed:  # the weights and gradients stay too: those not there yet come
        for B in blocks[:n]:
            need += B.numel * B.dtype.itemsize  # gradients
            need += sum(p.numel * B.dtype.itemsize for p in B.everything
                        if p.param.device != config.device)  # fmt: skip
    free, _ = import_torch().cuda.mem_get_info(config.device)
    if need > free:
        raise InvalidRequestError(
            f"hbm_blocks {n}: their state needs {need / 2**30:.1f} GiB of the GPU's memory, "
            f"which has {free / 2**30:.1f} GiB free; give fewer blocks"
        )


def place_state(
    blocks: list[Block],
    host_alloc: HostAlloc,
    config: OffloadConfig,
    engine: Any,
    start: Callable[[Any], Any] | None = None,
) -> None:
    """Each block's fp32 state (master from the weights, moments zero) on the tier, and
    where the mode keeps them there, its gradients and weights (pinned on a GPU); the
    first ``config.hbm_blocks`` blocks' state in the device's memory, and nothing of
    theirs on the tier. Streamed, each parameter's values are written into its home,
    which it then holds. ``start``: a parameter's starting values (a checkpoint's), read
    instead of its own (it may be on ``meta`` until then)."""
    torch = import_torch()
    pinned = on_gpu = config.on_gpu

    def values(p: ParamSlot) -> Any:
        return (start(p.param) if start is not None else p.param.detach()).reshape(-1)

    for position, B in enumerate(blocks):
        size = B.dtype.itemsize
        if position < config.hbm_blocks:
            B.state = torch.zeros(3 * B.numel, dtype=torch.float32, device=config.device)
            with torch.no_grad():
                for p in B.params:
                    B.part(B.state, 0, p).copy_(values(p))
            B.flight.updated = engine.event()
            continue
        B.state = host_alloc(3 * B.numel * 4, pinned).view(torch.float32).zero_()
        if config.streamed:
            B.weights = host_alloc(B.total * size, pinned).view(B.dtype).zero_()
            B.grads = host_alloc(B.numel * size, pinned).view(B.dtype).zero_()
        elif on_gpu:
            B.grads = host_alloc(B.numel * size, True).view(B.dtype)
            B.weights = host_alloc(B.numel * size, True).view(B.dtype)
        with torch.no_grad():
            for p in B.everything if config.streamed else B.params:
                v = values(p)
                if p.group >= 0:  # trainable
                    B.part(B.state, 0, p).copy_(v)
                if config.streamed:  # its home now: the copy it had is let go block by
                    # block (a model built on the host is never there twice)
                    home = piece(B.weights, p)
                    home.copy_(v)
                    place(p.param, home.view(p.shape))
        if on_gpu:
            B.flight.landed, B.flight.updated = engine.event(), engine.event()
