"""Where each block's optimizer update runs, chosen from measured rates: a pure function
of the blocks' sizes and the two sides' rates, so it is tested without a GPU.

The CPU side updates a block in place on the tier (its rate: parameters per second of
the fused CPU step over that node's memory); the GPU side streams the block's state over
the link, updates it and streams it back (its rate: parameters per second the link
carries both ways at once). Blocks go, in index order, each to the side that would
finish it first, so both sides end together and the first blocks (the next forward
pass's first) are spread over both.

Where the update begins in the backward pass (``update_in_backward``), the CPU side
takes the last blocks, whose gradients come first, and starts on them before
``step()``; the GPU side takes the first blocks, which the next forward pass needs
first, at ``step()``. The boundary is where both finish soonest, given the CPU's head
start.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

BALANCED = 0.1  # sides within 10% of each other: the split stays
REFINE_STEPS = 3  # steps whose timings may move the split


@dataclass(frozen=True)
class UpdatePlan:
    """Which blocks are updated where, and the rates that chose it (parameters per
    second: the CPU step over the tier's memory, the GPU's over state streamed both
    ways), with the update time they predict."""

    cpu: tuple[int, ...]
    gpu: tuple[int, ...]
    cpu_rate: float | None
    gpu_rate: float | None
    predicted_s: float | None
    why: str
    in_backward: bool = False  # the CPU's blocks are the last ones, begun in the backward pass
    seen: bool = False  # the rates are ones seen in steps, both sides running (not set-up's)

    def __str__(self) -> str:
        def rate(r: float | None) -> str:
            return "not measured" if r is None else f"{r / 1e9:.2f} G parameters/s"

        lines = [
            f"CPU: blocks {format_blocks(self.cpu) or 'none'} ({rate(self.cpu_rate)})",
            f"GPU: blocks {format_blocks(self.gpu) or 'none'} ({rate(self.gpu_rate)})",
        ]
        if self.predicted_s is not None:
            when = " after step()" if self.in_backward else ""
            lines.append(f"update predicted {self.predicted_s * 1e3:.0f} ms{when}: {self.why}")
        else:
            lines.append(self.why)
        return "\n".join(lines)


def format_blocks(ids: Sequence[int]) -> str:
    """Block numbers as ranges: ``0-3,7``."""
    from ..values import format_ranges

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


def plan_split(
    sizes: Mapping[int, int],
    cpu_rate: float,
    gpu_rate: float,
    why: str,
    *,
    head_s: float | None = None,
) -> UpdatePlan:
    """The plan that ``split`` makes, with the update time the rates predict; with
    ``head_s`` (the update begun in the backward pass), the one of ``split_from_the_end``
    and the time it predicts after ``step()``."""
    if head_s is not None:
        cpu, gpu, after = split_from_the_end(sizes, cpu_rate, gpu_rate, head_s)
        return UpdatePlan(tuple(cpu), tuple(gpu), cpu_rate, gpu_rate, after, why, True)
    cpu, gpu = split(sizes, cpu_rate, gpu_rate)
    predicted = max(sum(sizes[i] for i in cpu) / cpu_rate, sum(sizes[i] for i in gpu) / gpu_rate)
    return UpdatePlan(tuple(cpu), tuple(gpu), cpu_rate, gpu_rate, predicted, why)


@dataclass
class StepTimes:
    """The update of the last steps: seconds on each side (the CPU's from its first
    block to its last; the GPU's from the first copy in to the last copy out), and how
    long the CPU side ran before ``step()`` (begun in the backward pass); the last few
    kept."""

    cpu_s: float = 0.0
    gpu_s: float = 0.0
    head_s: float = 0.0
    steps: int = 0
    history: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=8))

    def add(self, cpu_s: float, gpu_s: float, head_s: float = 0.0) -> None:
        """One more step's update: its seconds on each side, the CPU's head start."""
        self.cpu_s, self.gpu_s, self.head_s = cpu_s, gpu_s, head_s
        self.steps += 1
        self.history.append((cpu_s, gpu_s))


def refined(plan: UpdatePlan, sizes: Mapping[int, int], times: StepTimes) -> UpdatePlan | None:
    """A new plan from the last step's timings, or None where the plan stays: after
    the first REFINE_STEPS steps, or where a side had no blocks (it showed no rate).
    Where the sides finished within BALANCED of each other the split stays, and a plan
    still showing the set-up's rates takes the ones seen."""
    t = times
    if t.steps > REFINE_STEPS or not t.cpu_s or not t.gpu_s or not plan.cpu or not plan.gpu:
        return None
    cpu_end = t.cpu_s - t.head_s if plan.in_backward else t.cpu_s  # after step()
    cpu_rate = sum(sizes[i] for i in plan.cpu) / t.cpu_s
    gpu_rate = sum(sizes[i] for i in plan.gpu) / t.gpu_s
    why = f"rates of step {t.steps}"
    if abs(cpu_end - t.gpu_s) <= BALANCED * max(cpu_end, t.gpu_s):
        # the split stays; the rates and the time shown are the ones seen, both sides
        # running (the set-up's were each side alone)
        if plan.seen:
            return None
        kept = f"{why}, split kept"
        predicted = max(cpu_end, t.gpu_s)
        return replace(plan, cpu_rate=cpu_rate, gpu_rate=gpu_rate, predicted_s=predicted,
                       why=kept, seen=True)  # fmt: skip
    head = t.head_s if plan.in_backward else None
    return replace(plan_split(sizes, cpu_rate, gpu_rate, why, head_s=head), seen=True)
