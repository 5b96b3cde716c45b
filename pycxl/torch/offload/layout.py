"""The repeated blocks of a model (a transformer's layers) laid out in flat memory on a
tier: each block's trainable parameters first, in order, each starting aligned, then
its frozen ones. The same element offsets index the block's weights, gradients and
optimizer state (fp32 ``[master | exp_avg | exp_avg_sq]``), so one offset moves a
parameter's piece between them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ...base.errors import InvalidRequestError
from .._import import import_torch

ALIGN_ELEMENTS = 64  # 128 bytes of bf16, 256 of fp32: every piece starts aligned


@dataclass(eq=False)  # one slot per parameter: found by identity, never by its tensors
class ParamSlot:
    """One parameter of a block and where it sits in the block's flat layout."""

    param: Any
    group: int  # index into the optimizer's param_groups (-1: frozen)
    offset: int  # in elements
    numel: int
    shape: tuple[int, ...]


@dataclass
class InFlight:
    """A block's update and copies under way: per-step state, apart from its layout."""

    cpu_update: Future[None] | None = None  # the CPU step of this block in flight
    updated: Any = None  # event: the new weights are where the next forward reads them
    landed: Any = None  # event: the block's gradients have reached host memory
    kept: list[Any] = field(default_factory=list)  # device gradients until they land


@dataclass(eq=False)  # a block is itself (``in``, ``index()``), never equal by its tensors
class Block:
    """One block: its parameters' layout and its memory on the tier (set once, at
    set-up), and what of its update is in flight (``flight``, per step)."""

    index: int
    module: Any
    params: list[ParamSlot]  # trainable: they have gradients and state
    frozen: list[ParamSlot]  # streamed with the weights, never updated
    numel: int  # elements of the trainable span, alignment included
    total: int  # elements of the whole layout (trainable and frozen)
    dtype: Any
    state: Any = None  # fp32 host tensor [master | exp_avg | exp_avg_sq], numel each
    grads: Any = None  # host tensor (dtype, numel): the gradients a CPU or GPU step reads
    weights: Any = None  # host tensor (dtype): new weights (resident), the home (stream)
    incoming: Any = None  # host tensor: a later micro-batch's gradients, added into grads
    flight: InFlight = field(default_factory=InFlight)

    def part(self, flat: Any, which: int, p: ParamSlot) -> Any:
        """``p``'s piece of region ``which`` (0 master, 1 exp_avg, 2 exp_avg_sq) of a
        flat fp32 tensor laid out like ``state``."""
        return self.part_span(flat, which, p.offset, p.offset + p.numel)

    def part_span(self, flat: Any, which: int, a: int, b: int) -> Any:
        """Elements ``a`` to ``b`` of region ``which`` (0 master, 1 exp_avg, 2
        exp_avg_sq) of a flat fp32 tensor laid out like ``state``."""
        at = which * self.numel
        return flat[at + a : at + b]

    @property
    def everything(self) -> list[ParamSlot]:
        """Every parameter of the block in layout order: trainable, then frozen."""
        return self.params + self.frozen


def piece(flat: Any, p: ParamSlot) -> Any:
    """``p``'s elements of a flat tensor laid out like the block's weights."""
    return flat[p.offset : p.offset + p.numel]


def _aligned(n: int) -> int:
    return -(-n // ALIGN_ELEMENTS) * ALIGN_ELEMENTS


def layout_blocks(
    modules: list[Any],
    group_of: Mapping[int, int],
    *,
    with_frozen: bool,
    split_dtypes: bool = False,
) -> list[Block]:
    """A Block for each module that has parameters to keep: trainable ones (their group
    from ``group_of``, by id), and with ``with_frozen`` the frozen ones too. A module
    whose parameters mix dtypes is refused by name, or with ``split_dtypes`` laid out as
    one block per dtype (the same module and index: nothing streams them as one)."""
    out = []
    seen: set[int] = set()
    for i, module in enumerate(modules):
        params = [p for p in module.parameters() if id(p) not in seen]
        seen.update(id(p) for p in params)
        strangers = [p for p in params if p.requires_grad and id(p) not in group_of]
        if strangers:
            raise InvalidRequestError(
                f"block {i} ({type(module).__name__}) has parameters the optimizer does not "
                "hold: give blocks of the model the optimizer was made for"
            )
        trainable = [p for p in params if p.requires_grad]
        frozen = [p for p in params if not p.requires_grad] if with_frozen else []
        kept = trainable + frozen
        dtypes = list(dict.fromkeys(p.dtype for p in kept))
        if len(dtypes) > 1 and not split_dtypes:
            raise InvalidRequestError(
                f"block {i} mixes parameter dtypes {sorted(map(str, dtypes))}: give its "
                "parameters one dtype (model.to(torch.bfloat16))"
            )
        for dtype in dtypes:
            mine = [p for p in trainable if p.dtype == dtype]
            still = [p for p in frozen if p.dtype == dtype]
            out.append(_block(i, module, mine, still, group_of, dtype))
    return out


def _block(
    index: int, module: Any, trainable: list[Any], frozen: list[Any],
    group_of: Mapping[int, int], dtype: Any,
) -> Block:  # fmt: skip
    """One block's layout: its trainable parameters first, each aligned, then frozen."""
    at, slots = 0, []
    for p in trainable:
        slots.append(ParamSlot(p, group_of[id(p)], at, p.numel(), tuple(p.shape)))
        at += _aligned(p.numel())
    numel = at
    still = []
    for p in frozen:
        still.append(ParamSlot(p, -1, at, p.numel(), tuple(p.shape)))
        at += _aligned(p.numel())
    return Block(index, module, slots, still, numel, at, dtype)


def check_trainable(blocks: list[Block]) -> None:
    """Blocks one optimizer trains as one: some parameters to train, of one dtype."""
    if not any(B.params for B in blocks):
        raise InvalidRequestError("the blocks have no trainable parameters")
    kinds = sorted({str(B.dtype) for B in blocks})
    if len(kinds) > 1:
        raise InvalidRequestError(
            f"the blocks' parameters are of several dtypes ({', '.join(kinds)}): give them "
            "one (model.to(torch.bfloat16))"
        )


Key = TypeVar("Key")


def chunks_of(
    block: Block, limit: int, params: list[ParamSlot], key: Callable[[ParamSlot], Key]
) -> list[tuple[int, int, Key]]:
    """The span of ``params`` (the block's parameters to update, in layout order) in
    pieces of at most ``limit`` elements, each over neighbouring parameters of one
    ``key`` (their param group and step number: one update runs a piece): (start, end,
    key), alignment gaps inside a run included."""
    out: list[tuple[int, int, Key]] = []
    runs: list[tuple[int, int, Key]] = []
    for p in params:
        k = key(p)
        if runs and runs[-1][2] == k and runs[-1][1] == p.offset:
            runs[-1] = (runs[-1][0], p.offset + _aligned(p.numel), k)
        else:
            runs.append((p.offset, p.offset + _aligned(p.numel), k))
    for start, end, k in runs:
        end = min(end, block.numel)
        for a in range(start, end, limit):
            out.append((a, min(a + limit, end), k))
    return out


def find_blocks(model: Any) -> list[Any]:
    """The model's repeated blocks: the ``ModuleList`` holding the most parameters whose
    entries are all of one type (a transformer's layers)."""
    torch = import_torch()
    best: list[Any] = []
    best_size = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) < 2:
            continue
        kinds = {type(m) for m in module}
        size = sum(p.numel() for p in module.parameters())
        if len(kinds) == 1 and size > best_size:
            best, best_size = list(module), size
    if not best:
        raise InvalidRequestError(
            f"{type(model).__name__} has no list of repeated blocks (a ModuleList of "
            "layers of one type): pass the blocks yourself (blocks=model.layers)"
        )
    return best
