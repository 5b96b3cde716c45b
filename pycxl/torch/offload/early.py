"""The update begun in the backward pass (``update_in_backward``): once a block's
gradients have all arrived (streamed: are on their way home), its step begins, the CPU's
at once (the last blocks first, while autograd computes the earlier blocks' gradients),
the GPU's where the plan begins it there.

It begins only where the result is PyTorch's, which the loop's habits decide: the first
step() shows them (its update waits for step()), and each step() after that renews them.
A loop that accumulates over N micro-batches begins the update in the Nth backward pass;
one that changes the gradients between its backward pass and step() (clipping, GradScaler
unscaling) waits for step() every step, as the update needs the changed gradients.
What a begun step read is recorded, so that a loop that changes its habit is refused by
name, and may go on from there: a backward pass more than before step(), a gradient
changed in place, a learning rate set before step(), or ``zero_grad()`` with no step()
after a backward pass that updated blocks."""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class Habit:
    """What the loop did in its last step: how many backward passes reached the blocks
    before step() (0: not known yet), and whether it changed their gradients between
    the last of them and step()."""

    passes: int = 0
    touches: bool = False

    def begins(self, completed: int) -> bool:
        """The update begins in the backward pass that gave blocks their ``completed``-th
        gradients: the last the loop makes, where it leaves them as they are."""
        return self.passes > 0 and not self.touches and completed == self.passes


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
        self._passes: dict[int, int] = {}  # backward passes that completed a block's
        # blocks left for step(): the gradients as their last backward pass left them
        self._left: dict[int, list[tuple[Any, int]]] = {}
        self.habit = Habit()

    def gradient_arrived(self, B: Block, param: Any) -> None:
        """Resident: a parameter's gradient was accumulated; once the block's are all
        there, its step begins where the plan says (the GPU's may wait for step())."""
        n = self._arrived.get(B.index, 0) + 1
        self._arrived[B.index] = n
        if n < len(B.params):
            return
        self._arrived[B.index] = 0
        params = [p for p in B.params if p.param.grad is not None]
        side = self._side(B, [p.param.grad for p in params])
        if side is None:
            return
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
        homes = self._offload._home_grads(B)
        # what the adder adds is not there yet: its block waits for step()
        if self._side(B, [] if adding else homes, may_begin=not adding) != "cpu":
            return
        self._early[B.index] = [(p, g, g._version) for p, g in zip(B.params, homes, strict=True)]
        self._offload._early_cpu(B, B.params, copy_out=False)

    def _side(
        self, B: Block, grads: list[Any], *, may_begin: bool = True
    ) -> Literal["cpu", "gpu"] | None:
        """A backward pass completed ``B``'s gradients (``grads``): the side whose step
        of ``B`` begins now: "cpu" where the plan gives the CPU the block, "gpu" where it
        begins the GPU's there, None where it waits for step() (the habit says so, or the
        plan); a backward pass more than the habit's, after it began, is refused."""
        completed = self._passes.get(B.index, 0) + 1
        self._passes[B.index] = completed
        if B.index in self._early:
            self.forget()  # the loop may go on from its next step
            raise InvalidRequestError(
                f"block {B.index} took gradients in backward pass {completed} before "
                f"optimizer.step(), its update begun in pass {completed - 1} (the last "
                "step's last): with update_in_backward=True keep the micro-batches a step "
                "(gradient accumulation) the same (the next step learns them again), or "
                "use update_in_backward=False"
            )
        if not (may_begin and self.habit.begins(completed)):
            self._left[B.index] = [(g, g._version) for g in grads]
            return None
        self._left.pop(B.index, None)
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
        self._clear()
        self.habit = Habit()  # the loop changed: the next step shows it again
        self._offload._forgotten(early)
        return early

    def _clear(self) -> None:
        self._arrived.clear()
        self._passes.clear()
        self._left.clear()
        self.begun = False

    def learn(self, *, clipped: bool) -> None:
        """At step(), before the update: the habit of this step's loop, for the next
        (``clipped``: a clip left its coefficient for the update)."""
        changed = any(g._version != version for left in self._left.values() for g, version in left)
        self.habit = Habit(max(self._passes.values(), default=0), clipped or changed)

    def take(self) -> set[int]:
        """At step(): the blocks begun in the backward pass; the record cleared."""
        early = set(self._early)
        self._early = {}
        self._clear()
        return early

    def unstepped(self) -> None:
        """zero_grad(): a backward pass that began updating blocks and no step() came
        (GradScaler skipping a step, a refused step, a pass for its gradients alone) is
        refused by name; the record is cleared, so the loop may go on."""
        if not self.begun:
            self._clear()  # a skipped step, or a backward pass that raised half-way
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
            "unclipped gradients, the rest not (the last step did not clip; a loop that "
            "clips every step is learned from its first step); drop update_in_backward "
            "for a loop with clipping on only some steps"
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
