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


def checkpointing_on(models: list[Any], use_reentrant: bool | None = False) -> None:
    """Activation checkpointing on for Hugging Face ``models``, set to train, by the name
    transformers gives it now (``activation_checkpointing_enable``); an older one has only
    ``gradient_checkpointing_enable``, which a newer one warns goes in v6.
    ``use_reentrant`` None: transformers' own default."""
    kwargs = None if use_reentrant is None else {"use_reentrant": use_reentrant}
    for m in models:
        enable = getattr(m, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        m.train()
