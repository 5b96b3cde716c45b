"""Where ``offload_model``'s blocks are updated, kept over the run: the first split from
the rates measured at set-up (or fixed by ``update=``), refined from the first steps'
timings, or fixed by ``set_plan``. The split itself is update_split.py's pure function."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ...base.errors import InvalidRequestError
from .config import OffloadConfig
from .cpu_side import CpuSide
from .gpu_side import GpuSide
from .layout import Block
from .update_split import StepTimes, UpdateSplit, format_blocks, refined, split_blocks


class SplitKeeper:
    """The split of ``blocks`` between the CPU side and the GPU side (None: no GPU)."""

    def __init__(
        self,
        blocks: Sequence[Block],
        config: OffloadConfig,
        cpu: CpuSide,
        gpu: GpuSide | None,
        *,
        in_hbm: Sequence[int] = (),
    ) -> None:
        self._sizes = {B.index: B.numel for B in blocks}
        self._in_hbm = set(in_hbm)  # the GPU's always, not split
        self._config = config
        self._has_gpu = gpu is not None
        self.fixed = config.fixed  # the timings no longer move the split
        self.current = self._first(blocks, cpu, gpu)

    def _first(self, blocks: Sequence[Block], cpu: CpuSide, gpu: GpuSide | None) -> UpdateSplit:
        everything = tuple(self._sizes)
        update = self._config.update
        if gpu is None:
            return UpdateSplit(everything, (), None, None, None, "no GPU: the CPU updates all")
        if update == "cpu":
            return UpdateSplit(everything, (), None, None, None, "fixed: update='cpu'")
        if update == "gpu":
            return UpdateSplit((), everything, None, None, None, "fixed: update='gpu'")
        if not blocks:
            return UpdateSplit((), (), None, None, None, "every block's state is in HBM")
        B = max(blocks, key=lambda b: b.numel)
        cpu_rate = cpu.params_per_s(B)
        gpu_rate = gpu.link_bytes_per_s(B) / self._bytes_per_param(blocks[0])
        # begun in the backward pass: the CPU's head start is not known before a step
        head = 0.0 if self._config.update_in_backward else None
        return split_blocks(self._sizes, cpu_rate, gpu_rate, "rates measured at set-up",
                          head_s=head, gpu_begins=not self._config.streamed)  # fmt: skip

    def _bytes_per_param(self, B: Block) -> int:
        """What the GPU side moves over the link each way for a parameter: master and
        moments, and streamed, the gradient in and the weight out."""
        return 12 + (B.dtype.itemsize if self._config.streamed else 0)

    def refine(self, times: StepTimes) -> None:
        """The split moved by a step's timings, unless it is fixed."""
        if self.fixed or not self._has_gpu or not self._sizes:
            return
        gpu_begins = not self._config.streamed
        new = refined(self.current, self._sizes, times, gpu_begins=gpu_begins)
        if new is not None:
            self.current = new

    def checked(self, gpu: Iterable[int], gpu_early: Iterable[int]) -> tuple[list[int], list[int]]:
        """``set_plan``'s blocks, refused by name where they cannot be: (the GPU's, in
        order; those begun in the backward pass, in the order their gradients come)."""
        chosen = sorted(set(gpu))
        early = sorted(set(gpu_early), reverse=True)
        known = set(self._sizes)
        held = sorted({i for i in chosen + early if i in self._in_hbm})
        if held:
            raise InvalidRequestError(
                f"blocks {format_blocks(held)} keep their state in HBM (hbm_blocks): the GPU "
                f"updates them there; set_plan splits blocks {format_blocks(sorted(known))}"
            )
        bad = [i for i in chosen + early if i not in known]
        if bad:
            raise InvalidRequestError(
                f"blocks {bad}: this model's blocks are {format_blocks(sorted(known))}"
            )
        if chosen and not self._has_gpu:
            raise InvalidRequestError("no GPU to update blocks on: the CPU updates them all")
        if early and not self._config.gpu_begins_in_backward:
            raise InvalidRequestError(
                "gpu_early begins blocks in the backward pass: it needs "
                "update_in_backward=True and weights='resident'"
            )
        if not set(early) <= set(chosen):
            raise InvalidRequestError(
                f"gpu_early blocks {format_blocks(sorted(set(early) - set(chosen)))} are not "
                "among the GPU's (gpu=...): name them there too"
            )
        return chosen, early

    def fix(self, chosen: list[int], early: list[int]) -> UpdateSplit:
        """From now on, ``chosen`` on the GPU (``early`` of them begun in the backward
        pass) and the rest on the CPU (blocks as ``checked`` gave them)."""
        cpu = tuple(i for i in sorted(self._sizes) if i not in chosen)
        self.fixed = True
        self.current = UpdateSplit(
            cpu, tuple(chosen), self.current.cpu_rate, self.current.gpu_rate, None,
            "fixed by set_plan", self._config.update_in_backward, gpu_early=tuple(early),
        )  # fmt: skip
        return self.current
