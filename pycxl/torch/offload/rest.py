"""The parameters of a model offload outside its blocks (embeddings, the final norm, the
head): fp32 masters and Adam moments in the device's memory (the master is the parameter
itself where it is fp32), updated there by PyTorch's fused Adam, or by the CPU step
without a GPU."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .._import import import_torch
from .adam import AdamSettings, AdamSteps, CpuAdam, gpu_adam_step
from .gpu_side import CHUNK_ELEMENTS

Entry = tuple[Any, Any, Any, Any]  # (param, fp32 master, exp_avg, exp_avg_sq)
# (bf16 weight or None where the master is the weight, gradient, master, exp_avg, exp_avg_sq)
Piece = tuple[Any, Any, Any, Any, Any]


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
        self.fused_step(live, settings)

    def fused_step(self, live: list[Entry], settings: list[AdamSettings]) -> None:
        """The step of ``live`` by PyTorch's fused Adam where the tensors lie (the GPU's,
        or the CPU's own fused kernel), a batch of pieces a call."""
        torch = import_torch()
        by_group: dict[tuple[int, int], list[Entry]] = {}
        for entry in live:
            key = (self._group_of[id(entry[0])], self.steps.of(entry[0]))
            by_group.setdefault(key, []).append(entry)
        for (g, n_step), entries in by_group.items():
            step_t = torch.full((), float(n_step), dtype=torch.float32, device=self.device)
            for batch in _pieces(entries):
                grads = [grad.float() if grad.dtype != torch.float32 else grad
                         for _, grad, _, _, _ in batch]  # fmt: skip
                gpu_adam_step([m for _, _, m, _, _ in batch], grads, [a for *_, a, _ in batch],
                              [b for *_, b in batch], step_t, settings[g])  # fmt: skip
                for weight, _, m, _, _ in batch:
                    if weight is not None:
                        weight.copy_(m)

    def follow_weights(self) -> None:
        """The masters set from the parameters (after the model's weights were loaded)."""
        for p, master, _, _ in self.entries:
            if master.data_ptr() != p.data.data_ptr():
                master.copy_(p.detach())


def _pieces(entries: list[Entry]) -> Iterator[list[Piece]]:
    """The entries cut into flat pieces, batched at most ``CHUNK_ELEMENTS`` a batch (made
    as each is asked for): the fp32 copies of a bf16 gradient the fused Adam needs are
    then one batch's, not the whole embedding's and head's (1.2 GiB at a 32000 x 5120
    vocabulary)."""
    torch = import_torch()
    batch: list[Piece] = []
    room = CHUNK_ELEMENTS
    for p, master, a, b in entries:
        weight = None if master.data_ptr() == p.data.data_ptr() else p.data
        if not (p.is_contiguous() and master.is_contiguous()):  # whole, as it lies
            if batch:
                yield batch
                batch, room = [], CHUNK_ELEMENTS
            # the fused Adam reads its tensors' elements in order, not by their strides:
            # the gradient laid out as the master is
            yield [(weight, torch.empty_like(master).copy_(p.grad), master, a, b)]
            continue
        grad, flat = p.grad.reshape(-1), master.view(-1)
        for start in range(0, flat.numel(), CHUNK_ELEMENTS):
            cut = slice(start, min(start + CHUNK_ELEMENTS, flat.numel()))
            if cut.stop - start > room:
                yield batch
                batch, room = [], CHUNK_ELEMENTS
            room -= cut.stop - start
            batch.append((None if weight is None else weight.view(-1)[cut], grad[cut],
                          flat[cut], a.view(-1)[cut], b.view(-1)[cut]))  # fmt: skip
    if batch:
        yield batch
