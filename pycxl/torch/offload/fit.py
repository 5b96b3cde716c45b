"""Whether a model trains under ``offload_model`` on a machine, and how fast at best,
before any memory is taken: a pure function of the model's shape, the tokens a step
trains on and the machine's free memory and rates, so it is tested without a GPU.

What each placement holds is offload_model's own layout (model_setup.py, ferry.py,
gpu_side.py, rest.py):

- on the tier, for every parameter of the blocks: the fp32 master and two Adam moments
  (12 bytes) and, with a GPU, pinned gradients and weights (2 x the weights' bytes);
- in HBM, resident: the blocks' weights and gradients; streamed: a ring of
  ``lookahead + 1`` blocks' weights and two blocks' gradients on their way home;
- in HBM either way: the rest of the model (embeddings, final norm, head) with its
  gradients, fp32 masters and moments, the GPU side's update buffers, the CUDA context
  and libraries, and the activations.

The activations are estimated from the shape: what autograd saves for a decoder block
with SDPA attention and a gated MLP in bf16, ``24 h + 8 i`` bytes a token a block (as
counted for transformers' Llama, tests/unit/test_fit.py; fp32 weights under autocast
keep about 1.75 times that), plus the logits and their gradient, 10 bytes a token a
vocabulary entry; with activation checkpointing, a block's input a token a block and
one block's worth recomputed. It is an estimate: the figure that decides a tight fit is
the one a real step shows.

The step's bound is the largest of: the GPU's compute (6 FLOPs a parameter a token, 8
with checkpointing, and causal attention's ``6 L s h`` a token), at the rate the GPU
sustains; the link's busier direction for what crosses it a step (weights and gradients,
and the state of the blocks the GPU updates); and the CPU's update of its blocks, the
blocks split between the two sides as offload_model splits them. With ``overlap`` they run beside
each other, so a step takes at least the largest; the prediction is that bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...base.errors import InvalidRequestError
from .update_split import split_blocks

STATE_BYTES = 12  # fp32 master, exp_avg, exp_avg_sq
CONTEXT_BYTES = 1 << 30  # the CUDA context, cuBLAS and the caching allocator's slack
UPDATE_BUFFERS = 2 * (1 << 23) * (4 * 4 + 2 * 2)  # gpu_side: two pieces of 8 Mi elements
LOGIT_BYTES = 10  # bf16 logits, their fp32 copy for the loss and its gradient


@dataclass(frozen=True)
class TrainShape:
    """A model as the plan sees it: ``block_params`` in all ``layers`` repeated blocks,
    ``rest_params`` outside them, weights of ``dtype_bytes`` (the rest's:
    ``rest_dtype_bytes``); ``hidden``, ``intermediate`` and ``vocab`` size the
    activations."""

    block_params: int
    rest_params: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    dtype_bytes: int = 2
    rest_dtype_bytes: int = 2

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
        for what, v in (("layers", layers), ("hidden", hidden), ("vocab", vocab)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidRequestError(f"{what} {v!r}: give a whole number above 0")
        if intermediate is None:
            intermediate = -(-(8 * hidden // 3) // 256) * 256
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
        from .layout import find_blocks

        found = blocks if blocks is not None else find_blocks(model)
        in_blocks = {id(p) for b in found for p in b.parameters() if p.requires_grad}
        trainable = [p for p in model.parameters() if p.requires_grad]
        block_ps = [p for p in trainable if id(p) in in_blocks]
        rest_ps = [p for p in trainable if id(p) not in in_blocks]
        if not block_ps:
            raise InvalidRequestError("the model's blocks have no trainable parameters")
        config = getattr(model, "config", None)
        hidden = int(getattr(config, "hidden_size", 0) or _widest(block_ps))
        return cls(
            block_params=sum(p.numel() for p in block_ps),
            rest_params=sum(p.numel() for p in rest_ps),
            layers=len(found),
            hidden=hidden,
            intermediate=int(getattr(config, "intermediate_size", 0) or 4 * hidden),
            vocab=int(getattr(config, "vocab_size", 0) or 0),
            dtype_bytes=block_ps[0].element_size(),
            rest_dtype_bytes=rest_ps[0].element_size() if rest_ps else 2,
        )


def _widest(params: list[Any]) -> int:
    return int(max(min(p.shape) for p in params if p.dim() == 2))


@dataclass(frozen=True)
class Machine:
    """What the plan reads of a machine: free bytes in HBM and on the tier, and rates
    (None: not known; the plan then says what it cannot predict). ``link``: bytes per
    second each way between HBM and the tier; ``cpu_update``: parameters per second of
    the CPU's Adam step on the tier; ``gpu_flops``: the GPU's sustained bf16 rate."""

    tier: str
    hbm_free: int | None
    tier_free: int
    link: float | None = None
    cpu_update: float | None = None
    gpu_flops: float | None = None


PARTS = {
    "block_weights": "blocks' weights",
    "block_gradients": "blocks' gradients",
    "rest": "rest (weights, gradients, fp32 state)",
    "activations_estimate": "activations (estimate)",
    "update_buffers": "update buffers",
    "cuda_context": "CUDA context and libraries",
    "optimizer_state": "optimizer state (fp32 master, moments)",
    "pinned_gradients_weights": "pinned gradients and weights",
}  # each part's name in a table


@dataclass(frozen=True)
class Option:
    """One placement: bytes in HBM and on the tier by part, whether it fits (and how
    much more each needs where not), and the step's bound where the rates are known."""

    weights: str  # "resident" or "stream"
    checkpointing: bool
    hbm: dict[str, int]
    tier: dict[str, int]
    short_hbm: int  # bytes more HBM it would need (0: fits)
    short_tier: int
    step_s: float | None
    bound: str  # what bounds the step (or what is not known)
    parts_s: dict[str, float] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        """Both memories hold what this placement puts there."""
        return self.short_hbm == 0 and self.short_tier == 0

    @property
    def name(self) -> str:
        """``resident`` / ``stream``, and ``+ checkpointing``."""
        return self.weights + (" + checkpointing" if self.checkpointing else "")


@dataclass(frozen=True)
class Fit:
    """The placements offload_model can run, best first (the fastest that fits; where
    the rates are not known, the one that moves least), and the one chosen (None:
    nothing fits; ``why`` says how much more memory, on which side)."""

    shape: TrainShape
    tokens: int
    seq: int
    machine: Machine
    options: tuple[Option, ...]

    @property
    def chosen(self) -> Option | None:
        """The first placement that fits, if any."""
        return next((o for o in self.options if o.fits), None)

    @property
    def why(self) -> str:
        """One line: the choice and its bound, or what is missing."""
        c = self.chosen
        if c is not None:
            when = "" if c.step_s is None else f", a step at least {c.step_s * 1e3:.0f} ms"
            return f"fits: weights {c.name}{when} ({c.bound})"
        least = min(self.options, key=lambda o: (o.short_hbm, o.short_tier))
        need = []
        if least.short_hbm:
            need.append(f"{_gib(least.short_hbm)} more HBM")
        if least.short_tier:
            need.append(f"{_gib(least.short_tier)} more free on {self.machine.tier}")
        fixes = []
        if least.short_hbm:
            fixes.append("fewer tokens a step")
        if least.short_tier:
            fixes.append(f"more free memory on {self.machine.tier} (or a tier beside it)")
        return (
            f"fits in no placement: the nearest (weights {least.name}) needs "
            f"{' and '.join(need)}: {' and '.join(fixes)}"
        )

    def to_dict(self) -> dict[str, Any]:
        """As ``pycxl plan-train --json`` prints it: bytes, seconds, bytes per second."""
        m, c = self.machine, self.chosen
        return {
            "tokens": self.tokens,
            "seq": self.seq,
            "model": {
                "params": self.shape.params, "block_params": self.shape.block_params,
                "rest_params": self.shape.rest_params, "layers": self.shape.layers,
                "hidden": self.shape.hidden, "intermediate": self.shape.intermediate,
                "vocab": self.shape.vocab, "dtype_bytes": self.shape.dtype_bytes,
            },
            "machine": {
                "tier": m.tier, "hbm_free": m.hbm_free, "tier_free": m.tier_free,
                "link_bytes_per_s": m.link, "cpu_update_params_per_s": m.cpu_update,
                "gpu_flops_per_s": m.gpu_flops,
            },
            "placements": [
                {
                    "weights": o.weights, "checkpointing": o.checkpointing, "fits": o.fits,
                    "hbm": o.hbm, "hbm_total": sum(o.hbm.values()), "tier": o.tier,
                    "tier_total": sum(o.tier.values()), "short_hbm": o.short_hbm,
                    "short_tier": o.short_tier, "step_s": o.step_s, "parts_s": o.parts_s,
                    "bound": o.bound,
                }
                for o in self.options
            ],
            "chosen": None if c is None else self.options.index(c),
            "why": self.why,
        }  # fmt: skip


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def activation_bytes(shape: TrainShape, tokens: int, checkpointing: bool) -> int:
    """Activations a step keeps for its backward pass (the module's text says how)."""
    per_block = 24 * shape.hidden + 8 * shape.intermediate  # a token, a block, in bf16
    if shape.dtype_bytes == 4:
        per_block = per_block * 7 // 4
    logits = LOGIT_BYTES * shape.vocab * tokens
    if checkpointing:
        return shape.layers * tokens * 2 * shape.hidden + tokens * per_block + logits
    return shape.layers * tokens * per_block + logits


def _option(
    shape: TrainShape,
    m: Machine,
    tokens: int,
    seq: int,
    weights: str,
    checkpointing: bool,
    lookahead: int,
) -> Option:
    d, n, layers = shape.dtype_bytes, shape.block_params, shape.layers
    block = -(-n // layers)
    r, rd = shape.rest_params, shape.rest_dtype_bytes
    hbm = {
        "block_weights": n * d if weights == "resident" else (lookahead + 1) * block * d,
        "block_gradients": n * d if weights == "resident" else 2 * block * d,
        "rest": r * (2 * rd + (0 if rd == 4 else 4) + 8),
        "activations_estimate": activation_bytes(shape, tokens, checkpointing),
        "update_buffers": UPDATE_BUFFERS,
        "cuda_context": CONTEXT_BYTES,
    }
    tier = {"optimizer_state": STATE_BYTES * n, "pinned_gradients_weights": 2 * d * n}
    short_hbm = 0 if m.hbm_free is None else max(0, sum(hbm.values()) - m.hbm_free)
    short_tier = max(0, sum(tier.values()) - m.tier_free)
    parts: dict[str, float] = {}
    if m.gpu_flops:
        flops = (8 if checkpointing else 6) * shape.params * tokens
        flops += 6 * layers * seq * shape.hidden * tokens  # causal attention
        parts["compute"] = flops / m.gpu_flops
    if m.link and m.cpu_update:
        # the update split as offload_model splits it: the CPU side's blocks at its
        # rate, the GPU side's streaming their state both ways over the link
        per_param = STATE_BYTES + (d if weights == "stream" else 0)
        plan = split_blocks({i: block for i in range(layers)}, m.cpu_update, m.link / per_param,
                            "rates given")  # fmt: skip
        on_gpu = block * len(plan.gpu)
        # streamed: the weights come in twice (forward, backward) and gradients go home;
        # resident: gradients go home and new weights come back for the CPU's blocks
        moved = (2 if weights == "stream" else 1) * n * d + on_gpu * per_param
        parts["link"] = moved / m.link
        parts["update"] = block * len(plan.cpu) / m.cpu_update
    known = {"compute", "link", "update"} <= parts.keys()
    if known:
        what = max(parts, key=lambda k: parts[k])
        bound = f"bound by {what}: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in parts.items())
        step: float | None = parts[what]
    else:
        missing = [w for w, ok in (("the GPU's rate", m.gpu_flops), ("the link's rate", m.link),
                                   ("the CPU update's rate", m.cpu_update)) if not ok]  # fmt: skip
        bound = f"no step time: {', '.join(missing)} not known"
        step = None
    return Option(weights, checkpointing, hbm, tier, short_hbm, short_tier, step, bound, parts)


def fit(
    shape: TrainShape, machine: Machine, tokens: int, *, seq: int | None = None, lookahead: int = 1
) -> Fit:
    """The placements for a step of ``tokens`` (sequences of ``seq``, default one of
    ``tokens``), fastest first where the rates are known, else resident before streamed
    and without checkpointing before with it."""
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise InvalidRequestError(f"tokens {tokens!r}: give a whole number above 0")
    seq = tokens if seq is None else seq
    if not isinstance(seq, int) or isinstance(seq, bool) or not 1 <= seq <= tokens:
        raise InvalidRequestError(f"seq {seq!r}: give a whole number from 1 to tokens ({tokens})")
    options = [
        _option(shape, machine, tokens, seq, w, c, lookahead)
        for c in (False, True)
        for w in ("resident", "stream")
    ]
    order = {id(o): i for i, o in enumerate(options)}
    options.sort(key=lambda o: (o.step_s is None, o.step_s or 0.0, order[id(o)]))
    return Fit(shape, tokens, seq, machine, tuple(options))
