"""The parameters of a model offload outside its blocks (embeddings, the final norm, the
head): fp32 masters and Adam moments in the device's memory (the master is the parameter
itself where it is fp32), updated there by PyTorch's fused Adam, or by the CPU step
without a GPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._import import import_torch
from .adam import AdamSettings, AdamSteps, CpuAdam, gpu_adam_step

Entry = tuple[Any, Any, Any, Any]  # (param, fp32 master, exp_avg, exp_avg_sq)


class RestUpdate:
    """``params``: trainable parameters outside the blocks, on ``device``; ``group_of``:
    each one's param group, by id; ``steps``: the offload's step counts (these counted
    there too)."""

    def __init__(
        self, params: list[Any], group_of: Mapping[int, int], device: Any, steps: AdamSteps
    ) -> None:
        torch = import_torch()
        self.device = device
        self.on_gpu = device.type == "cuda"
        self._group_of = group_of
        self.entries: list[Entry] = []
        for p in params:
            master = p.data if p.dtype == torch.float32 else p.detach().float()
            self.entries.append((p, master, torch.zeros_like(master), torch.zeros_like(master)))
        self.steps = steps
        steps.add(params)

    def step(self, settings: list[AdamSettings], cpu: CpuAdam) -> None:
        """One step of every parameter with a gradient (``cpu`` without a GPU)."""
        live = [e for e in self.entries if e[0].grad is not None]
        self.steps.advance(p for p, *_ in live)
        if not live:
            return
        if not self.on_gpu:
            for p, m, a, b in live:
                grad = (
                    p.grad.reshape(-1) if p.grad.is_contiguous() else p.grad.contiguous().view(-1)
                )
                weight = None if m.data_ptr() == p.data.data_ptr() else p.data.view(-1)
                cpu.step((m.view(-1), a.view(-1), b.view(-1)), grad, weight,
                         self.steps.of(p), settings[self._group_of[id(p)]])  # fmt: skip
            return
        torch = import_torch()
        by_group: dict[tuple[int, int], list[Entry]] = {}
        for entry in live:
            key = (self._group_of[id(entry[0])], self.steps.of(entry[0]))
            by_group.setdefault(key, []).append(entry)
        for (g, n_step), entries in by_group.items():
            step_t = torch.full((), float(n_step), dtype=torch.float32, device=self.device)
            grads = [
                p.grad.float() if p.grad.dtype != torch.float32 else p.grad for p, *_ in entries
            ]
            gpu_adam_step([m for _, m, _, _ in entries], grads, [a for *_, a, _ in entries],
                          [b for *_, b in entries], step_t, settings[g])  # fmt: skip
            for p, m, _, _ in entries:
                if m.data_ptr() != p.data.data_ptr():
                    p.data.copy_(m)

    def follow_weights(self) -> None:
        """The masters set from the parameters (after the model's weights were loaded)."""
        for p, master, _, _ in self.entries:
            if master.data_ptr() != p.data.data_ptr():
                master.copy_(p.detach())
