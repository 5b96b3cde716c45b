"""Where each block's optimizer update runs, chosen from measured rates: a pure function
of the blocks' sizes and the two sides' rates, so it is tested without a GPU.

The CPU side updates a block in place on the tier (its rate: parameters per second of
the fused CPU step over that node's memory); the GPU side streams the block's state over
the link, updates it and streams it back (its rate: parameters per second the link
carries both ways at once). Blocks go, in index order, each to the side that would
finish it first, so both sides end together and the first blocks (the next forward
pass's first) are spread over both.

Where the update begins in the backward pass (``update_in_backward``), before any step
has shown how long the backward pass is, the CPU side takes the last blocks, whose
gradients come first, and starts on them before ``step()``; the GPU side takes the
first blocks, which the next forward pass needs first, at ``step()``. Once a step has
shown it, the plan follows both sides through a step: gradients arrive over the
backward pass, last block first, and each side, when free, takes the last block whose
gradients are there, then after ``step()`` the first block left, whichever side would
finish it first; so the GPU side too begins blocks in the backward pass, while the
host's memory has room beside the CPU's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

BALANCED = 0.1  # sides within 10% of each other: the split stays
REFINE_STEPS = 3  # steps whose timings may move the split


@dataclass(frozen=True)
class UpdateSplit:
    """Which blocks are updated where, and the rates that chose it (parameters per
    second: the CPU step over the tier's memory, the GPU's over state streamed both
    ways), with the update time they predict."""

    cpu: tuple[int, ...]
    gpu: tuple[int, ...]
    cpu_rate: float | None
    gpu_rate: float | None
    predicted_s: float | None
    why: str
    in_backward: bool = False  # blocks begin as their gradients arrive in the backward pass
    seen: bool = False  # the rates are ones seen in steps, both sides running (not set-up's)
    gpu_early: tuple[int, ...] = ()  # GPU blocks begun in the backward pass, in that order
    hbm: tuple[int, ...] = ()  # blocks whose state lives in HBM: updated there, not split

    def __str__(self) -> str:
        def rate(r: float | None) -> str:
            return "not measured" if r is None else f"{r / 1e9:.2f} G parameters/s"

        lines = [
            f"CPU: blocks {format_blocks(self.cpu) or 'none'} ({rate(self.cpu_rate)})",
            f"GPU: blocks {format_blocks(self.gpu) or 'none'} ({rate(self.gpu_rate)})",
        ]
        if self.gpu_early:
            lines[-1] += f", of which {format_blocks(sorted(self.gpu_early))} begun in backward"
        if self.hbm:
            lines.insert(0, f"HBM: blocks {format_blocks(self.hbm)} (state in HBM, updated there)")
        if self.predicted_s is not None:
            when = " after step()" if self.in_backward else ""
            lines.append(f"update predicted {self.predicted_s * 1e3:.0f} ms{when}: {self.why}")
        else:
            lines.append(self.why)
        return "\n".join(lines)


def format_blocks(ids: Sequence[int]) -> str:
    """Block numbers as ranges: ``0-3,7``."""
    from ...base.values import format_ranges

    return format_ranges(list(ids))


def split(
    sizes: Mapping[int, int], cpu_rate: float, gpu_rate: float
) -> tuple[list[int], list[int]]:
    """Blocks (index -> parameters) for each side, in index order, each block to the
    side that would finish it first."""
    cpu: list[int] = []
    gpu: list[int] = []
    t_cpu = t_gpu = 0.0
    for index, n in sorted(sizes.items()):
        if t_cpu + n / cpu_rate <= t_gpu + n / gpu_rate:
            cpu.append(index)
            t_cpu += n / cpu_rate
        else:
            gpu.append(index)
            t_gpu += n / gpu_rate
    return cpu, gpu


def split_from_the_end(
    sizes: Mapping[int, int], cpu_rate: float, gpu_rate: float, head_s: float
) -> tuple[list[int], list[int], float]:
    """Blocks for each side where the CPU begins ``head_s`` seconds before the GPU (in
    the backward pass): the CPU the last blocks, the GPU the first ones, split where
    both are done soonest; with the seconds after the GPU's start that takes."""
    order = sorted(sizes)
    best: tuple[float, int] | None = None
    for k in range(len(order) + 1):  # the GPU takes order[:k]
        t_gpu = sum(sizes[i] for i in order[:k]) / gpu_rate
        t_cpu = max(0.0, sum(sizes[i] for i in order[k:]) / cpu_rate - head_s)
        t = max(t_cpu, t_gpu)
        if best is None or t < best[0]:
            best = (t, k)
    assert best is not None
    t, k = best
    return order[k:], order[:k], t


def schedule_in_backward(
    sizes: Mapping[int, int], cpu_rate: float, gpu_rate: float, backward_s: float
) -> tuple[list[int], list[int], list[int], float]:
    """Blocks for each side where gradients arrive evenly over ``backward_s`` seconds
    before ``step()`` (the last block's at once, the first block's at ``step()``): each
    time a side is free, the last block whose gradients are there (after ``step()``,
    the first block left) goes to the side that would finish it first. Returns the
    CPU's blocks, the GPU's, the GPU's begun before ``step()`` (in the order begun),
    and the seconds after ``step()`` until both are done."""
    order = sorted(sizes)
    last = max(len(order) - 1, 1)
    # the first block's exactly at step(): it is never begun before
    arrives = {i: backward_s - backward_s * k / last for k, i in enumerate(order)}
    rate = {"cpu": cpu_rate, "gpu": gpu_rate}
    free = {"cpu": 0.0, "gpu": 0.0}
    taken: dict[str, list[int]] = {"cpu": [], "gpu": []}
    early: list[int] = []
    left = set(order)
    while left:
        t = max(min(free.values()), min(arrives[i] for i in left))
        ready = [i for i in left if arrives[i] <= t]
        pick = max(ready) if t < backward_s else min(ready)
        done = {side: max(free[side], t) + sizes[pick] / rate[side] for side in rate}
        # a tie: the side idle longer (it has waited), then the CPU
        side = min(done, key=lambda k: (done[k], free[k]))
        if side == "gpu" and max(free["gpu"], t) < backward_s:
            early.append(pick)
        free[side] = done[side]
        taken[side].append(pick)
        left.remove(pick)
    after = max(0.0, max(free.values()) - backward_s)
    return sorted(taken["cpu"]), sorted(taken["gpu"]), early, after


def split_blocks(
    sizes: Mapping[int, int],
    cpu_rate: float,
    gpu_rate: float,
    why: str,
    *,
    head_s: float | None = None,
    gpu_begins: bool = True,
) -> UpdateSplit:
    """The plan that ``split`` makes, with the update time the rates predict; with
    ``head_s`` (the update begun in the backward pass; the seconds from the first
    block's gradients to ``step()``), the one of ``schedule_in_backward`` and the time
    it predicts after ``step()``; where no step has shown it yet (0), or where the GPU
    side cannot begin blocks in the backward pass (``gpu_begins`` False: streamed
    weights), the one of ``split_from_the_end``."""
    if head_s and gpu_begins:
        cpu, gpu, early, after = schedule_in_backward(sizes, cpu_rate, gpu_rate, head_s)
        return UpdateSplit(tuple(cpu), tuple(gpu), cpu_rate, gpu_rate, after, why, True,
                          gpu_early=tuple(early))  # fmt: skip
    if head_s is not None:
        cpu, gpu, after = split_from_the_end(sizes, cpu_rate, gpu_rate, head_s)
        return UpdateSplit(tuple(cpu), tuple(gpu), cpu_rate, gpu_rate, after, why, True)
    cpu, gpu = split(sizes, cpu_rate, gpu_rate)
    predicted = max(sum(sizes[i] for i in cpu) / cpu_rate, sum(sizes[i] for i in gpu) / gpu_rate)
    return UpdateSplit(tuple(cpu), tuple(gpu), cpu_rate, gpu_rate, predicted, why)


@dataclass
class StepTimes:
    """The update of the last step: each side's seconds on its blocks (the rates come
    from these), how long the backward pass ran from the first block's gradients to
    ``step()`` (where the update begins in it), and how long each side ran on after
    ``step()``; ``history``: the last few steps' seconds after ``step()``, CPU side and
    GPU side."""

    cpu_s: float = 0.0
    gpu_s: float = 0.0
    head_s: float = 0.0
    cpu_after_s: float = 0.0
    gpu_after_s: float = 0.0
    steps: int = 0
    history: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=8))

    def add(
        self,
        cpu_s: float,
        gpu_s: float,
        head_s: float = 0.0,
        gpu_after_s: float | None = None,
        cpu_after_s: float | None = None,
    ) -> None:
        """One more step's update: each side's seconds on its blocks, the backward pass's
        seconds before ``step()``, and each side's seconds after ``step()`` (where not
        given, all of them: nothing began before)."""
        self.cpu_s, self.gpu_s, self.head_s = cpu_s, gpu_s, head_s
        self.cpu_after_s = cpu_s if cpu_after_s is None else cpu_after_s
        self.gpu_after_s = gpu_s if gpu_after_s is None else gpu_after_s
        self.steps += 1
        self.history.append((self.cpu_after_s, self.gpu_after_s))


def refined(
    plan: UpdateSplit, sizes: Mapping[int, int], times: StepTimes, *, gpu_begins: bool = True
) -> UpdateSplit | None:
    """A new plan from the last step's timings, or None where the plan stays: after
    the first REFINE_STEPS steps, or where a side with blocks showed no time. A side
    the plan gave no blocks keeps the plan's rate for it (set-up's), so a plan that
    gave one side everything is looked at again. Where the sides finished within
    BALANCED of each other the split stays (unless, begun in the backward pass, the
    rates seen predict a plan BALANCED sooner), and a plan still showing the set-up's
    rates takes the ones seen. ``gpu_begins``: whether the GPU side may begin blocks in
    the backward pass (``split_blocks``)."""
    t = times
    if t.steps > REFINE_STEPS or (plan.cpu and not t.cpu_s) or (plan.gpu and not t.gpu_s):
        return None
    cpu_rate = sum(sizes[i] for i in plan.cpu) / t.cpu_s if plan.cpu else plan.cpu_rate
    gpu_rate = sum(sizes[i] for i in plan.gpu) / t.gpu_s if plan.gpu else plan.gpu_rate
    if cpu_rate is None or gpu_rate is None:
        return None
    # after step(): where the update begins in the backward pass, part of it ran before
    cpu_end, gpu_end = t.cpu_after_s, t.gpu_after_s
    why = f"rates of step {t.steps}"
    head = t.head_s if plan.in_backward else None
    new = split_blocks(sizes, cpu_rate, gpu_rate, why, head_s=head, gpu_begins=gpu_begins)
    new = replace(new, seen=bool(plan.cpu and plan.gpu))  # both rates seen, or not yet
    took = max(cpu_end, gpu_end)
    sooner = new.predicted_s is not None and new.predicted_s < (1 - BALANCED) * took
    # a plan the GPU side may begin in the backward pass moves where it is sooner
    moves = plan.in_backward and gpu_begins and sooner
    if abs(cpu_end - gpu_end) <= BALANCED * took and not moves:
        # the split stays; the rates and the time shown are the ones seen, both sides
        # running (the set-up's were each side alone)
        if plan.seen:
            return None
        return replace(plan, cpu_rate=cpu_rate, gpu_rate=gpu_rate, predicted_s=took,
                       why=f"{why}, split kept", seen=True)  # fmt: skip
    return new
