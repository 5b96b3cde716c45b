"""The clocks of a model offload's step: when its update began (at step(), or at the
first block's gradients in the backward pass), when step() was called, and each side's
seconds after it, read into ``StepTimes`` for the plan. Resident on a GPU they are read
on the device's clock (the host runs ahead of the device, so its clock showed the CPU
side beginning and ending late); elsewhere on the host's."""

from __future__ import annotations

import time
from typing import Any

from .cpu_side import CpuSide
from .gpu_side import GpuSide, borrowed
from .update_split import StepTimes


class StepClock:
    """``device_clock``: times on the device's clock; ``on_gpu``: events at step()."""

    def __init__(self, *, on_gpu: bool, device_clock: bool) -> None:
        self.device_clock = device_clock
        self.began_at = 0.0  # when this step's update began (the host's clock)
        self.from_backward = False  # whether it began in the backward pass
        self.step_called = 0.0  # when step() was called (the host's clock)
        self.untimed = False  # this step was refused: its times would mislead the plan
        self.at_step: Any = None  # step() on the device: the backward pass's work done
        self.began: Any = None  # the update's beginning there
        if on_gpu:
            from ...gpu.streams import Event

            self.at_step, self.began = Event(), Event()

    def begin(self, engine: Any, stream: Any) -> None:
        """The update begins; ``stream``: where autograd (or the loop) has got to."""
        self.began_at = time.perf_counter()
        if self.device_clock:
            engine.record(self.began, stream)

    def step_called_on(self, stream: Any, *, from_backward: bool) -> None:
        """step() was called, the update begun in the backward pass or not; ``stream``
        (None without a GPU): the device's stream at step()."""
        self.step_called = time.perf_counter()
        self.from_backward = from_backward
        if stream is not None:
            self.at_step.record(borrowed(stream))

    def read(self, cpu: CpuSide, gpu: GpuSide | None, times: StepTimes) -> None:
        """The last step's times added to ``times``: each side's seconds at work and
        after step(), the backward pass's from the update's beginning; nothing from a
        refused step (its update ran in part)."""
        timed = gpu.take_timed() if gpu is not None else {}
        if self.untimed:
            self.untimed = False
            return
        gpu_s, gpu_after_s = gpu.seconds(timed, self.at_step) if gpu else (0.0, 0.0)
        head_s, cpu_after_s = self._head_and_cpu_after(cpu)
        times.add(
            cpu_s=cpu.end - cpu.first, gpu_s=gpu_s, head_s=head_s,
            gpu_after_s=gpu_after_s, cpu_after_s=cpu_after_s,
        )  # fmt: skip

    def _head_and_cpu_after(self, cpu: CpuSide) -> tuple[float, float]:
        """Seconds from the update's beginning in the backward pass to step() (0 where it
        began at step()), and the CPU side's after step()."""
        if not self.device_clock:
            head = self.step_called - self.began_at if self.from_backward else 0.0
            after = cpu.end - self.step_called if cpu.first else 0.0
            return head, max(0.0, after)
        self.at_step.synchronize()
        head = self.at_step.ms_since(self.began) / 1e3 if self.from_backward else 0.0
        if not cpu.first:
            return head, 0.0
        cpu.done.synchronize()
        return head, max(0.0, cpu.done.ms_since(self.at_step) / 1e3)
