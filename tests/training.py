"""The training loop the offload tests compare: micro-batches whose losses are summed
into one step, optional clipping by global norm and a learning-rate scheduler, as a
PyTorch user writes it."""

from __future__ import annotations

from typing import Any


def train(
    model: Any,
    opt: Any,
    data: list[list[Any]],
    *,
    clip: float | None = None,
    sched: Any = None,
    norms: list[float] | None = None,
) -> list[float]:
    """One optimizer step per entry of ``data`` (its micro-batches of token ids, each
    its own labels); the step's loss for each; the clip's norms into ``norms``."""
    import torch

    losses = []
    for micro in data:
        total = 0.0
        for x in micro:
            loss = model(input_ids=x, labels=x).loss / len(micro)
            loss.backward()
            total += float(loss.detach())
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if norms is not None:
                norms.append(float(norm))
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        losses.append(total)
    return losses
