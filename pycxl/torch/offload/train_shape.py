"""A model as the plan (fit.py) sees it, and what a step of it keeps for its backward pass.

The activations are estimated from the shape: what autograd saves for a decoder block
with SDPA attention and a gated MLP in bf16, ``24 h + 8 i`` bytes a token a block (as
counted for transformers' Llama, tests/unit/test_fit.py; fp32 weights under autocast
keep about 1.75 times that), plus what the loss's backward pass holds, ``LOGIT_BYTES``
(12) a token a vocabulary entry; with activation checkpointing, a block's input a token
a block and one block's worth recomputed (checkpointing some blocks: those, and the
others' whole).
It is an estimate: the figure that decides a tight fit is the one a real step shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...base.errors import InvalidRequestError
from ...base.values import MAX_LAYERS, MAX_WIDTH, count

# the loss's backward pass, measured: the fp32 log-softmax output, its gradient and the
# logits' gradient in fp32, each vocab x tokens (the bf16 logits are gone by then)
LOGIT_BYTES = 12
MAX_VOCAB = 1 << 24  # vocabulary entries: a hundred times today's largest
MAX_INTERMEDIATE = 8 * MAX_WIDTH


@dataclass(frozen=True)
class TrainShape:
    """A model as the plan sees it: ``block_params`` trainable in all ``layers`` repeated
    blocks, ``rest_params`` outside them, weights of ``dtype_bytes`` (the rest's:
    ``rest_dtype_bytes``); frozen parameters (weights only: no gradients, no state) in
    ``frozen_block_params`` and ``frozen_rest_params``; ``hidden``, ``intermediate`` and
    ``vocab`` size the activations."""

    block_params: int
    rest_params: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    dtype_bytes: int = 2
    rest_dtype_bytes: int = 2
    frozen_block_params: int = 0
    frozen_rest_params: int = 0

    @property
    def params(self) -> int:
        """Every trainable parameter."""
        return self.block_params + self.rest_params

    @classmethod
    def decoder(
        cls,
        *,
        layers: int,
        hidden: int,
        intermediate: int | None = None,
        vocab: int = 32000,
        params: int | None = None,
        tied: bool = False,
    ) -> TrainShape:
        """A Llama-shaped decoder: embeddings and head (``tied``: one matrix), a final
        norm, and ``layers`` blocks of attention (4 h x h, fewer with grouped-query
        attention: give ``params``) and a gated MLP (3 h x i); ``intermediate`` defaults
        to Llama's (8/3 h, rounded up to 256). ``params``: the model's count, where
        known: the blocks hold what the rest does not."""
        layers = count(layers, "layers", 1, MAX_LAYERS)
        hidden = count(hidden, "hidden", 1, MAX_WIDTH)
        vocab = count(vocab, "vocab", 1, MAX_VOCAB)
        if intermediate is None:
            intermediate = -(-(8 * hidden // 3) // 256) * 256
        intermediate = count(intermediate, "intermediate", 1, MAX_INTERMEDIATE)
        if params is not None:
            params = count(params, "params")
        rest = (1 if tied else 2) * vocab * hidden + hidden
        blocks = layers * (4 * hidden * hidden + 3 * hidden * intermediate + 2 * hidden)
        if params is not None:
            if params <= rest:
                raise InvalidRequestError(
                    f"{params} parameters: fewer than the embeddings and head alone "
                    f"({rest} for a vocabulary of {vocab} and hidden {hidden})"
                )
            blocks = params - rest
        return cls(blocks, rest, layers, hidden, intermediate, vocab)

    @classmethod
    def of_model(cls, model: Any, blocks: list[Any] | None = None) -> TrainShape:
        """A torch model's (on any device, ``meta`` included: only shapes are read),
        its blocks found as offload_model finds them."""
        from .._import import import_torch
        from .layout import find_blocks

        torch = import_torch()
        if not isinstance(model, torch.nn.Module):
            raise InvalidRequestError(
                f"model {type(model).__name__}: give a torch.nn.Module (on any device, "
                "meta included) or a TrainShape (TrainShape.decoder(layers=, hidden=))"
            )
        found = blocks if blocks is not None else find_blocks(model)
        block_ps = list({id(p): p for b in found for p in b.parameters()}.values())
        in_blocks = {id(p) for p in block_ps}
        rest_ps = [p for p in model.parameters() if id(p) not in in_blocks]
        trained = [p for p in block_ps if p.requires_grad]
        if not trained:
            raise InvalidRequestError("the model's blocks have no trainable parameters")
        config = getattr(model, "config", None)
        hidden = int(getattr(config, "hidden_size", 0) or _widest(trained))
        rest_trained = [p for p in rest_ps if p.requires_grad]
        return cls(
            block_params=sum(p.numel() for p in trained),
            rest_params=sum(p.numel() for p in rest_trained),
            layers=len(found),
            hidden=hidden,
            intermediate=int(getattr(config, "intermediate_size", 0) or 4 * hidden),
            vocab=int(getattr(config, "vocab_size", 0) or 0),
            dtype_bytes=trained[0].element_size(),
            rest_dtype_bytes=rest_ps[0].element_size() if rest_ps else 2,
            frozen_block_params=sum(p.numel() for p in block_ps if not p.requires_grad),
            frozen_rest_params=sum(p.numel() for p in rest_ps if not p.requires_grad),
        )


def _widest(params: list[Any]) -> int:
    """The hidden size a model without a config most likely has: its matrices' narrower
    side (a block of vectors only: the widest vector)."""
    return int(max((min(p.shape) for p in params if p.dim() >= 2),
                   default=max(p.numel() for p in params)))  # fmt: skip


def activation_bytes(shape: TrainShape, tokens: int, checkpointing: bool | int) -> int:
    """Activations a step keeps for its backward pass (the module's text says how);
    ``checkpointing``: every block checkpointed (True), none, or how many."""
    per_block = block_bytes_a_token(shape)
    logits = LOGIT_BYTES * shape.vocab * tokens
    k = checkpointed_blocks(shape, checkpointing)
    # the blocks after the first k keep theirs, freed as the backward pass leaves each,
    # before it recomputes a checkpointed block's (one at a time)
    kept = max(shape.layers - k, 1 if k else 0) * tokens * per_block
    return kept + k * tokens * 2 * shape.hidden + logits


def block_bytes_a_token(shape: TrainShape) -> int:
    """What autograd saves of a block for a token (the module's text says how)."""
    per_block = 24 * shape.hidden + 8 * shape.intermediate  # in bf16
    return per_block * 7 // 4 if shape.dtype_bytes == 4 else per_block


def checkpointed_blocks(shape: TrainShape, checkpointing: bool | int) -> int:
    """How many blocks ``checkpointing`` checkpoints: all (True), none, or that many."""
    if isinstance(checkpointing, bool):
        return shape.layers if checkpointing else 0
    return min(max(checkpointing, 0), shape.layers)
