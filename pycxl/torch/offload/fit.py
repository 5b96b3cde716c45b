"""Whether a model trains under ``offload_model`` on a machine, and how fast at best,
before any memory is taken: a pure function of the model's shape, the tokens a step
trains on and the machine's free memory and rates, so it is tested without a GPU.

What each placement holds is offload_model's own layout (model_setup.py, ferry.py,
gpu_side.py, rest.py):

- on the tier, for every trainable parameter of the blocks: the fp32 master and two Adam
  moments (12 bytes) and, with a GPU, pinned gradients and weights (2 x the weights'
  bytes; frozen parameters' weights too, where streamed); streamed with gradient
  accumulation, a second set of gradients for the micro-batch on its way home;
- in HBM, resident: the blocks' weights and gradients; streamed: a ring of
  ``lookahead + 1`` blocks' weights and the gradients of up to three blocks (the one
  being made and ``LANDING_MAX`` on their way home);
- in HBM either way: the rest of the model (embeddings, final norm, head) with its
  gradients, fp32 masters and moments, the GPU side's update buffers (``SLOTS`` pieces of
  at most ``CHUNK_ELEMENTS``, where the GPU updates any block), the CUDA context and
  libraries, and the activations.

The activations are estimated from the shape (train_shape.py). HBM's figure is its
peak, not the sum of everything a step ever holds: the activations are highest as the
forward pass ends and the gradients as the backward pass does (``step_peak``), and a
10.5 B model with 13 blocks' state in HBM peaked 4.9 GiB below that sum.

The step's bound is the largest of: the GPU's compute (6 FLOPs a parameter a token
for the blocks and the head: the input embedding is a lookup; and causal attention's
``6 L s h`` a token; a checkpointed block's forward again: 8 for the blocks where all
are), at the rate the GPU sustains; the link's busier direction for what crosses it a
step (streamed: the weights in twice and the gradients home; resident: the CPU's blocks'
gradients home and their new weights back; either way the state of the blocks the GPU
updates); and the update, both sides at once (the CPU's blocks at its rate, the GPU
side's state over the link), split as offload_model splits them, at their rates beside
each other where measured (they share the host's memory). With ``overlap`` these run
beside each other, so a step takes at least the largest. And where the update begins at
``step()`` (the default, and any loop that clips: the norm needs every gradient), only
the next step's first forward pass runs beside it (each block waiting for its own;
streamed, its weights come in meanwhile), and the rest of the step after it: at least
the update plus the step's compute less that forward pass (``update_in_backward``,
resident, with accumulation: less the last micro-batch's backward pass too; without,
the update runs beside the backward pass). The prediction is the largest of these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...base.errors import InvalidRequestError
from ...base.values import MAX_LAYERS, MAX_TOKENS, count, finite
from .ferry import LANDING_MAX
from .gpu_side import CHUNK_ELEMENTS, SLOTS
from .train_shape import (
    LOGIT_BYTES,
    TrainShape,
    block_bytes_a_token,
    checkpointed_blocks,
)
from .update_split import split_blocks

STATE_BYTES = 12  # fp32 master, exp_avg, exp_avg_sq
CONTEXT_BYTES = 1 << 30  # the CUDA context, cuBLAS and the caching allocator's slack
MAX_RATE = 1e18  # bytes, parameters or FLOPs a second: far past any machine's


@dataclass(frozen=True)
class Machine:
    """What the plan reads of a machine: free bytes in HBM and on the tier, and rates
    (None: not known; the plan then says what it cannot predict). ``link``: bytes per
    second each way between HBM and the tier; ``cpu_update``: parameters per second of
    the CPU's Adam step on the tier; ``gpu_flops``: the GPU's sustained bf16 rate;
    ``shared``: the CPU step's and the link's rates while both run at once, as they do in
    an update (they share the host's memory), where measured."""

    tier: str
    hbm_free: int | None
    tier_free: int
    link: float | None = None
    cpu_update: float | None = None
    gpu_flops: float | None = None
    shared: tuple[float, float] | None = None  # cpu_update and link while both run

    def __post_init__(self) -> None:
        for what, rate in (("link", self.link), ("cpu_update", self.cpu_update),
                           ("gpu_flops", self.gpu_flops)):  # fmt: skip
            if rate is not None:
                finite(rate, what, 0.0, MAX_RATE)
        if self.shared is not None:
            if not isinstance(self.shared, tuple) or len(self.shared) != 2:
                raise InvalidRequestError(
                    f"shared {self.shared!r}: give (cpu_update, link) measured beside each "
                    "other, or None"
                )
            for what, rate in zip(("shared cpu_update", "shared link"), self.shared,
                                  strict=True):  # fmt: skip
                finite(rate, what, 0.0, MAX_RATE)


PARTS = {
    "block_weights": "blocks' weights",
    "block_gradients": "blocks' gradients",
    "rest": "rest (weights, gradients, fp32 state)",
    "activations_estimate": "activations (estimate)",
    "update_buffers": "update buffers",
    "cuda_context": "CUDA context and libraries",
    "optimizer_state": "optimizer state (fp32 master, moments)",
    "pinned_gradients_weights": "pinned gradients and weights",
    "headroom": "headroom (the estimate's error, fragmentation)",
}  # each part's name in a table
BOUNDS = {
    "compute": "compute",
    "link": "link",
    "update": "update",
    "update_then_backward": "update + backward",
}  # what bounds a step, as ``why`` names it


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
    hbm_blocks: int = 0  # the first blocks whose state (streamed: and weights) is in HBM
    tier_instead: int = 0  # where HBM is short for the tier's sake: the tier's shortfall
    checkpointed_blocks: int = 0  # the first so many blocks are checkpointed (0 to all)
    layers: int = 0  # the model's blocks

    @property
    def fits(self) -> bool:
        """Both memories hold what this placement puts there."""
        return self.short_hbm == 0 and self.short_tier == 0

    @property
    def name(self) -> str:
        """``resident`` / ``stream``, and ``+ checkpointing`` (of how many blocks, where
        not all)."""
        if not self.checkpointing:
            return self.weights
        k = self.checkpointed_blocks
        some = 0 < k < self.layers
        return self.weights + " + checkpointing" + (f" of the first {k} blocks" if some else "")


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
    accumulation: int = 1
    lookahead: int = 1
    update_in_backward: bool = False

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
            held = ""
            if c.hbm_blocks == self.shape.layers:
                held = ", every block's state in HBM too (it trains in HBM without offload)"
            elif c.hbm_blocks:
                held = f", the state of {c.hbm_blocks} blocks in HBM (hbm_blocks={c.hbm_blocks})"
            return f"fits: weights {c.name}{held}{when} ({c.bound})"
        least = min(self.options, key=lambda o: (o.short_hbm, o.short_tier))
        need = []
        if least.short_hbm:
            need.append(f"{_gib(least.short_hbm)} more HBM")
        if least.short_tier:
            need.append(f"{_gib(least.short_tier)} more free on {self.machine.tier}")
        fixes = []
        if least.short_hbm:
            fixes.append("fewer tokens a step")
        if least.short_hbm and least.tier_instead:  # HBM was to hold what the tier cannot
            fixes[-1] += (f", or {_gib(least.tier_instead)} more free on {self.machine.tier} "
                          "(HBM then holds the state of fewer blocks)")  # fmt: skip
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
            "accumulation": self.accumulation,
            "lookahead": self.lookahead,
            "update_in_backward": self.update_in_backward,
            "model": {
                "params": self.shape.params, "block_params": self.shape.block_params,
                "rest_params": self.shape.rest_params,
                "frozen_block_params": self.shape.frozen_block_params,
                "frozen_rest_params": self.shape.frozen_rest_params,
                "layers": self.shape.layers,
                "hidden": self.shape.hidden, "intermediate": self.shape.intermediate,
                "vocab": self.shape.vocab, "dtype_bytes": self.shape.dtype_bytes,
            },
            "machine": {
                "tier": m.tier, "hbm_free": m.hbm_free, "tier_free": m.tier_free,
                "link_bytes_per_s": m.link, "cpu_update_params_per_s": m.cpu_update,
                "gpu_flops_per_s": m.gpu_flops,
                "shared_cpu_update_params_per_s": m.shared[0] if m.shared else None,
                "shared_link_bytes_per_s": m.shared[1] if m.shared else None,
            },
            "placements": [
                {
                    "weights": o.weights, "checkpointing": o.checkpointing, "fits": o.fits,
                    "checkpointed_blocks": o.checkpointed_blocks,
                    "hbm_blocks": o.hbm_blocks, "tier_instead": o.tier_instead,
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


def tier_bytes(
    shape: TrainShape,
    *,
    streamed: bool,
    on_gpu: bool,
    accumulation: int = 1,
    hbm_blocks: int = 0,
) -> dict[str, int]:
    """What offload_model places on the tier, by part (``PARTS``): the blocks' fp32
    state, and where the mode keeps them there, their weights and gradients (pinned
    with a GPU; streamed with accumulation, a later micro-batch's gradients too);
    nothing of the first ``hbm_blocks`` (the blocks are taken as equal)."""
    n, d = shape.block_params, shape.dtype_bytes
    weights_grads = 0
    if streamed:
        weights_grads = (n + shape.frozen_block_params + n) * d
        if accumulation > 1:
            weights_grads += n * d  # a later micro-batch's gradients, added at home
    elif on_gpu:
        weights_grads = 2 * n * d
    layers = max(shape.layers, 1)
    left = layers - min(hbm_blocks, layers)
    return {"optimizer_state": STATE_BYTES * n * left // layers,
            "pinned_gradients_weights": weights_grads * left // layers}  # fmt: skip


def check_tier_room(shape: TrainShape, *, streamed: bool, on_gpu: bool, free: int,
                    tier: str, hbm_blocks: int = 0) -> None:  # fmt: skip
    """Refused by name, before any of it is taken, where the tier has less free memory
    than offload_model would place there (nothing of the first ``hbm_blocks``)."""
    need = sum(tier_bytes(shape, streamed=streamed, on_gpu=on_gpu,
                          hbm_blocks=hbm_blocks).values())  # fmt: skip
    if need > free:
        in_hbm = ""
        layers = max(shape.layers, 1)
        each = sum(tier_bytes(shape, streamed=streamed, on_gpu=on_gpu).values()) // layers
        more = -(-(need - free) // max(each, 1))  # blocks whose state would leave the tier
        if on_gpu and hbm_blocks + more <= layers:
            in_hbm = f", or the state of {hbm_blocks + more} blocks in HBM (hbm_blocks=" \
                     f"{hbm_blocks + more}, where the GPU has room)"  # fmt: skip
        raise InvalidRequestError(
            f"the blocks' optimizer state{' and weights' if streamed or on_gpu else ''} need "
            f"{_gib(need)} on {tier}, which has {_gib(free)} free: {_gib(need - free)} more "
            f"free memory on {tier}, or another tier beside it ('{tier},<tier>'){in_hbm}; "
            "pycxl.fit or pycxl plan-train says which placement fits where"
        )


def _option(
    shape: TrainShape,
    m: Machine,
    tokens: int,
    seq: int,
    weights: str,
    checkpointing: bool | int,
    lookahead: int,
    accumulation: int,
    update_in_backward: bool = False,
) -> Option:
    d, n, layers = shape.dtype_bytes, shape.block_params, shape.layers
    checkpointed = checkpointed_blocks(shape, checkpointing)
    stream = weights == "stream"
    block, whole_block = -(-n // layers), -(-(n + shape.frozen_block_params) // layers)
    r = shape.rest_params

    def hbm_with(held: int) -> dict[str, int]:
        return _hbm_parts(shape, tokens, checkpointed, stream, lookahead, held, m.hbm_free or 0)

    everything = tier_bytes(shape, streamed=stream, on_gpu=True, accumulation=accumulation)
    room, needed = _blocks_in_hbm(shape, m, hbm_with, sum(everything.values()))
    held = max(room, needed)
    on_tier = layers - held
    hbm = hbm_with(held)

    def on_tier_bytes(blocks_in_hbm: int) -> dict[str, int]:
        return tier_bytes(shape, streamed=stream, on_gpu=True, accumulation=accumulation,
                          hbm_blocks=blocks_in_hbm)  # fmt: skip

    tier = on_tier_bytes(held)
    # where HBM holds fewer blocks than the tier needs it to: the tier's shortfall instead
    tier_instead = max(0, sum(on_tier_bytes(room).values()) - m.tier_free) if needed > room else 0
    plan = None
    per_param = STATE_BYTES + (d if stream else 0)  # what the GPU side moves each way
    if m.link and m.cpu_update and on_tier:
        # the update split as offload_model splits it: the CPU side's blocks at its
        # rate, the GPU side's streaming their state (streamed: and weights) both ways
        plan = split_blocks({i: block for i in range(on_tier)}, m.cpu_update, m.link / per_param,
                            "rates given")  # fmt: skip
    if on_tier == 0 or (plan is not None and not plan.gpu):
        # the GPU side updates no block on the tier: only the HBM blocks' fp32 piece
        hbm["update_buffers"] = min(CHUNK_ELEMENTS, block) * 4 if held else 0
    short_hbm = 0 if m.hbm_free is None else max(0, sum(hbm.values()) - m.hbm_free)
    short_tier = max(0, sum(tier.values()) - m.tier_free)
    parts: dict[str, float] = {}
    forward_s = 0.0  # a micro-batch's forward pass
    if m.gpu_flops:
        # the blocks' and the head's matrices (the input embedding is a lookup) and
        # causal attention, forward; the backward pass twice that; a checkpointed
        # block's forward (its matrices and attention) again
        blocks_fwd = 2 * (n + shape.frozen_block_params) * tokens
        blocks_fwd += 2 * layers * seq * shape.hidden * tokens
        forward = blocks_fwd + 2 * min(r, shape.vocab * shape.hidden) * tokens
        flops = 3 * forward + blocks_fwd * checkpointed / layers
        forward_s = forward / m.gpu_flops
        parts["compute"] = flops / m.gpu_flops * accumulation
    if m.link and m.cpu_update:
        on_gpu = block * len(plan.gpu) if plan else 0
        on_cpu = block * len(plan.cpu) if plan else 0
        if stream:  # the tier's blocks' weights come in each pass, their gradients go home
            moved = accumulation * on_tier * (2 * whole_block + block) * d
            moved += on_gpu * (STATE_BYTES + d)
        else:  # the CPU's blocks' gradients home and new weights back: each way
            moved = on_cpu * d + on_gpu * STATE_BYTES
        parts["link"] = moved / m.link
        # the update: both sides at once, at their rates beside each other where
        # measured (they share the host's memory), split so that they finish together,
        # as the offload's split comes to
        cpu_rate, link = m.shared or (m.cpu_update, m.link)
        both = split_blocks({i: block for i in range(on_tier)}, cpu_rate,
                            link / per_param, "rates beside each other")  # fmt: skip
        on_gpu_u, on_cpu_u = block * len(both.gpu), block * len(both.cpu)
        # what the update moves over the link (resident: the CPU's blocks' new weights
        # back too; streamed: the next forward pass's weights come in beside it)
        after = on_gpu_u * per_param + (on_tier * whole_block * d if stream else on_cpu_u * d)
        parts["update"] = max(on_cpu_u / cpu_rate, after / link)
        early = update_in_backward and not stream
        if "compute" in parts and not (early and accumulation == 1):
            # the update begins at step() (with update_in_backward, in the last
            # micro-batch's backward pass): what runs beside it is the next step's first
            # forward pass (each block waits for its own) and, begun early, that backward
            # pass; the rest of the step after it
            beside = parts["compute"] / accumulation if early else forward_s
            rest = parts["compute"] - beside
            if stream:  # and the rest of the step's weights in and gradients home
                moved_after = moved - on_gpu * per_param - on_tier * whole_block * d
                rest = max(rest, moved_after / m.link)
            parts["update_then_backward"] = max(parts["update"], beside) + rest
    if {"compute", "link", "update"} <= parts.keys():
        what = max(parts, key=lambda k: parts[k])
        bound = f"bound by {BOUNDS[what]}: " + ", ".join(
            f"{BOUNDS[k]} {v * 1e3:.0f} ms" for k, v in parts.items()
        )
        step: float | None = parts[what]
    else:
        missing = [w for w, ok in (("the GPU's rate", m.gpu_flops), ("the link's rate", m.link),
                                   ("the CPU update's rate", m.cpu_update)) if not ok]  # fmt: skip
        bound = f"no step time: {', '.join(missing)} not known"
        step = None
    return Option(weights, checkpointed > 0, hbm, tier, short_hbm, short_tier, step, bound, parts,
                  held, tier_instead, checkpointed, layers)  # fmt: skip


def hbm_headroom(hbm_free: int, activations: int) -> int:
    """HBM left free where blocks' state fills the rest: the activation estimate's error
    (it is within 15% of what autograd saves, tests/unit/test_fit.py) and the caching
    allocator's fragmentation (5% of what is free)."""
    return activations * 15 // 100 + hbm_free // 20


def _hbm_parts(shape: TrainShape, tokens: int, checkpointed: int, stream: bool,
               lookahead: int, held: int, hbm_free: int) -> dict[str, int]:  # fmt: skip
    """What HBM holds at the step's peak, by part, with the first ``held`` blocks' state
    (streamed: their weights and gradients too) there."""
    d, n, layers = shape.dtype_bytes, shape.block_params, shape.layers
    whole = n + shape.frozen_block_params  # what the blocks' weights hold
    block, whole_block = -(-n // layers), -(-whole // layers)
    r, rd = shape.rest_params, shape.rest_dtype_bytes
    streaming = stream and held < layers  # all held: no ring, no gradients on their way home
    gradients, activations = step_peak(shape, tokens, checkpointed, stream=stream, held=held)
    hbm = {
        "block_weights": (held + streaming * (lookahead + 1)) * whole_block * d if stream
        else whole * d,
        "block_gradients": gradients,
        "rest": r * (2 * rd + (0 if rd == 4 else 4) + 8) + shape.frozen_rest_params * rd,
        "activations_estimate": activations,
        "update_buffers": SLOTS * min(CHUNK_ELEMENTS, block) * (16 + 2 * d),
        "cuda_context": CONTEXT_BYTES,
    }  # fmt: skip
    if held:  # their state in HBM, not on the tier; the rest of HBM left free
        hbm["optimizer_state"] = held * block * STATE_BYTES
        hbm["headroom"] = hbm_headroom(hbm_free, activations)
    return hbm


def step_peak(shape: TrainShape, tokens: int, checkpointing: bool | int, *, stream: bool,
              held: int = 0) -> tuple[int, int]:  # fmt: skip
    """The blocks' gradients and the activations HBM holds at once at a step's peak:
    the backward pass frees each block's activations as it makes that block's
    gradients, so the two peak at different times. As the forward pass ends: every
    block's activations (``activation_bytes``) and the logits, no gradient yet. At each
    block of the backward pass, last first: the activations of that block and those
    before it (a checkpointed block's recomputed beside its input), and the gradients
    kept (resident: every block's from there on, until ``step()``; streamed: those of
    the first ``held`` blocks from there on, and of the streamed blocks among this one
    and the ``LANDING_MAX`` before it, on their way home)."""
    layers, d = shape.layers, shape.dtype_bytes
    block = -(-shape.block_params // layers) * d
    k = checkpointed_blocks(shape, checkpointing)
    whole = tokens * block_bytes_a_token(shape)  # a block's activations, kept whole
    saved = [tokens * 2 * shape.hidden if i < k else whole for i in range(layers)]
    below = sum(saved)  # the activations of the blocks up to the one the pass is at
    peak = (0, below + LOGIT_BYTES * shape.vocab * tokens)
    for j in reversed(range(layers)):
        activations = below + (whole if j < k else 0)
        below -= saved[j]
        if stream:
            window = min(layers, j + LANDING_MAX + 1) - max(j, held)
            kept = max(0, held - j) + max(0, window)
        else:
            kept = layers - j
        if kept * block + activations > sum(peak):
            peak = (kept * block, activations)
    return peak


def _blocks_in_hbm(
    shape: TrainShape, m: Machine, hbm_with: Callable[[int], dict[str, int]], on_tier: int
) -> tuple[int, int]:
    """How many blocks' state the HBM holds beside the step (the more, the less crosses
    the link and the less the CPU updates), and how many the tier's shortfall needs
    there (more than HBM holds: HBM falls short); none where HBM's free memory is not
    known."""
    layers = shape.layers
    if m.hbm_free is None:
        return 0, 0
    free = m.hbm_free

    def fits(held: int) -> bool:
        return sum(hbm_with(held).values()) <= free

    # more blocks held, more HBM at the peak; every block held drops the streamed ring
    room = layers if fits(layers) else 0
    low, high = 0, layers - 1
    while not room and low < high:  # the most that fit lies in [low, high]
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    room = room or low
    saved_each = on_tier // layers  # tier bytes one block in HBM leaves off the tier
    short = on_tier - m.tier_free
    needed = 0 if short <= 0 else min(layers, -(-short // max(saved_each, 1)))
    return room, needed


def checked_step(
    tokens: object, seq: object, lookahead: object, accumulation: object
) -> tuple[int, int, int, int]:
    """A step's shape as ``fit`` takes it, refused by name before anything is measured."""
    n = count(tokens, "tokens", 1, MAX_TOKENS)
    s = n if seq is None else seq
    if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= n:
        raise InvalidRequestError(f"seq {s!r}: give a whole number from 1 to tokens ({n})")
    return (
        n,
        s,
        count(lookahead, "lookahead", 0, MAX_LAYERS),
        count(accumulation, "accumulation", 1, MAX_TOKENS),
    )


def fit(
    shape: TrainShape,
    machine: Machine,
    tokens: int,
    *,
    seq: int | None = None,
    lookahead: int = 1,
    accumulation: int = 1,
    update_in_backward: bool = False,
) -> Fit:
    """The placements for a step of ``tokens`` a micro-batch (sequences of ``seq``,
    default one of ``tokens``) over ``accumulation`` micro-batches, fastest first where
    the rates are known, else resident before streamed and without checkpointing before
    with it. Where the activations fit only with checkpointing, a placement that
    checkpoints some of the blocks is one of them (``checkpointed_blocks``: the first so
    many; the others keep their activations and are not recomputed): the fastest where
    the rates are known, else the fewest that fit.
    ``update_in_backward``: as offload_model's, for a loop that leaves the
    gradients as the backward pass made them (no clip): resident, the update then runs
    beside the backward pass; otherwise it begins at ``step()``."""
    tokens, seq, lookahead, accumulation = checked_step(tokens, seq, lookahead, accumulation)

    def option(weights: str, checkpointed: int) -> Option:
        return _option(shape, machine, tokens, seq, weights, checkpointed, lookahead,
                       accumulation, update_in_backward)  # fmt: skip

    layers = shape.layers
    weights = ("resident", "stream")
    none = {w: option(w, 0) for w in weights}
    every = {w: option(w, layers) for w in weights}
    options = list(none.values())
    for w in weights:
        # where the activations of no checkpointing do not fit and those of all do: the
        # fewest blocks checkpointed that fit (HBM use falls as more are)
        if not none[w].fits and every[w].fits and layers > 1:
            low, high = 1, layers  # option(w, high) fits
            while low < high:
                mid = (low + high) // 2
                low, high = (low, mid) if option(w, mid).fits else (mid + 1, high)
            # every k from there fits: the fastest where the rates are known (fewer
            # checkpointed recompute less, but leave HBM fewer blocks' state), else the
            # fewest (min keeps the first of equals)
            some = [option(w, k) for k in range(high, layers)]
            if some:
                options.append(min(some, key=lambda o: o.step_s or 0.0))
    options += every.values()
    order = {id(o): i for i, o in enumerate(options)}
    options.sort(key=lambda o: (o.step_s is None, o.step_s or 0.0, order[id(o)]))
    return Fit(
        shape, tokens, seq, machine, tuple(options), accumulation, lookahead, update_in_backward
    )
