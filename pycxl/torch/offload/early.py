"""The update begun in the backward pass (``update_in_backward``): once a block's
gradients have all arrived (streamed: are on their way home), its step begins, the CPU's
at once (the last blocks first, while autograd computes the earlier blocks' gradients),
the GPU's where the plan begins it there. What the step read is recorded, so that
anything that changes it between the backward pass and step() is refused by name, and
the loop may go on from there: a second backward pass before step(), a gradient changed
in place (clipping, GradScaler's unscaling), a learning rate set before step(), or
``zero_grad()`` with no step() after a backward pass that updated blocks."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from ...base.errors import InvalidRequestError
from .adam import AdamSettings
from .layout import Block, ParamSlot
from .update_split import UpdateSplit, format_blocks


class Offload(Protocol):
    """What the early update asks of its offload (the offload's own, not its user's)."""

    def _check_open(self) -> None:
        """Refuse a closed offload."""

    def _begin(self) -> None:
        """Begin this step's update."""

    def plan(self) -> UpdateSplit:
        """The split of the blocks between the sides."""

    def synchronize(self) -> None:
        """Wait for the update in flight."""

    def _early_gpu(self, B: Block, params: list[ParamSlot]) -> None:
        """Begin ``B``'s GPU step."""

    def _early_cpu(self, B: Block, params: list[ParamSlot], *, copy_out: bool) -> None:
        """Begin ``B``'s CPU step."""

    def _home_grads(self, B: Block) -> list[Any]:
        """``B``'s gradients in their home."""

    def _forgotten(self, blocks: list[int]) -> None:
        """Hear that a refused step's record was cleared."""


class EarlyUpdate:
    """This step's record: whether its update began in the backward pass (``begun``),
    the blocks begun there with the gradients they read, and the gradients that have
    arrived, by block."""

    def __init__(self, offload: Offload) -> None:
        self._offload = offload
        self.begun = False
        # blocks whose step began in this backward pass: the gradient of each of their
        # parameters it read, and that gradient's version then (changed: refused at step())
        self._early: dict[int, list[tuple[ParamSlot, Any, int]]] = {}
        self._arrived: dict[int, int] = {}  # parameters with a gradient, by block

    def gradient_arrived(self, B: Block, param: Any) -> None:
        """Resident: a parameter's gradient was accumulated; once the block's are all
        there, its step begins where the plan says (the GPU's may wait for step())."""
        n = self._arrived.get(B.index, 0) + 1
        self._arrived[B.index] = n
        if n < len(B.params):
            return
        self._arrived[B.index] = 0
        side = self._side(B)
        if side is None:
            return
        params = [p for p in B.params if p.param.grad is not None]
        self._early[B.index] = [(p, p.param.grad, p.param.grad._version) for p in params]
        if side == "gpu":
            self._offload._early_gpu(B, params)
        else:
            self._offload._early_cpu(B, params, copy_out=True)

    def sent_home(self, B: Block, adding: bool, sent: list[int]) -> None:
        """Streamed: the block's gradients of ``sent`` (positions in its parameters)
        are on their way home, onto the earlier micro-batch's where ``adding`` (the
        adder thread's work: left for step()); once all of them are, its CPU step
        begins; the GPU side begins none in the backward pass here."""
        if len(sent) < len(B.params):
            return  # some took no gradient: the block waits for step(), as resident
        if self._side(B) != "cpu" or adding:
            return
        homes = self._offload._home_grads(B)
        self._early[B.index] = [(p, g, g._version) for p, g in zip(B.params, homes, strict=True)]
        self._offload._early_cpu(B, B.params, copy_out=False)

    def _side(self, B: Block) -> Literal["cpu", "gpu"] | None:
        """The side whose step of ``B`` begins now: "cpu" where the plan gives the CPU
        the block, "gpu" where it begins the GPU's there, None where it waits for step();
        a second backward pass that reaches it before step() is refused."""
        if B.index in self._early:
            self.forget()  # the loop may go on from its next step
            raise InvalidRequestError(
                f"block {B.index} took gradients again before optimizer.step(): with "
                "update_in_backward=True each backward pass updates the blocks; for "
                "gradient accumulation over micro-batches use update_in_backward=False"
            )
        self._offload._check_open()
        self._offload._begin()
        plan = self._offload.plan()
        if B.index in plan.cpu:
            return "cpu"
        return "gpu" if B.index in plan.gpu_early else None

    def forget(self) -> list[int]:
        """The record cleared (the next backward pass starts afresh); the blocks it had
        updated, which the offload is told of (their streamed device copies are stale)."""
        early = sorted(self._early)
        self._early = {}
        self._arrived.clear()
        self.begun = False
        self._offload._forgotten(early)
        return early

    def take(self) -> set[int]:
        """At step(): the blocks begun in the backward pass; the record cleared."""
        early = set(self._early)
        self._early = {}
        self._arrived.clear()
        self.begun = False
        return early

    def unstepped(self) -> None:
        """zero_grad(): a backward pass that began updating blocks and no step() came
        (GradScaler skipping a step, a refused step, a pass for its gradients alone) is
        refused by name; the record is cleared, so the loop may go on."""
        if not self.begun:
            self._arrived.clear()  # a backward pass that raised may have counted some
            return
        self._offload.synchronize()
        early = self.forget()
        if early:
            raise InvalidRequestError(
                f"gradients cleared with no optimizer.step() after a backward pass that "
                f"updated blocks {format_blocks(early)} (update_in_backward=True: the "
                "rest of the model was not updated); a loop that skips steps (GradScaler) "
                "needs update_in_backward=False"
            )

    def refuse_clipped(self) -> None:
        """At step(), after clip_grad_norm_ left its coefficient for the update: blocks
        begun in the backward pass took their gradients unclipped, so it is refused."""
        if not self._early:
            return
        self._offload.synchronize()
        early = format_blocks(self.forget())
        raise InvalidRequestError(
            f"clip_grad_norm_ between the backward pass and step(): with "
            f"update_in_backward=True blocks {early} were already updated from the "
            "unclipped gradients, the rest not; drop update_in_backward for a loop with clipping"
        )

    def check(self, settings: list[AdamSettings], then: list[AdamSettings]) -> None:
        """At step(): the blocks begun in the backward pass read their gradients as it
        made them, with the settings of ``then``: a gradient changed since (clipped,
        unscaled, replaced), or ``settings`` that differ (a learning rate set before
        step()), is refused, and the step is not taken further."""
        changed = next(
            (
                index
                for index, seen in self._early.items()
                for p, grad, version in seen
                if p.param.grad is not grad or grad._version != version
            ),
            None,
        )
        moved = self._early and settings != then
        if changed is None and not moved:
            return
        self._offload.synchronize()
        early = format_blocks(self.forget())
        if changed is not None:
            raise InvalidRequestError(
                f"a gradient of block {changed} changed between the backward pass and "
                "step() (clipping, GradScaler, a gradient set by hand): with "
                f"update_in_backward=True blocks {early} were already updated from the "
                "backward pass's, the rest not; drop update_in_backward for such a loop"
            )
        raise InvalidRequestError(
            "the optimizer's settings (a learning rate) changed between the backward pass "
            f"and step(): with update_in_backward=True blocks {early} were already updated "
            "with the earlier ones, the rest not; set them before the backward pass (a "
            "scheduler's step() after optimizer.step() does) or drop update_in_backward"
        )
