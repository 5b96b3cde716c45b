"""How a model offload runs, declared once: ``OffloadConfig``, checked where it enters.
What follows from it (on a GPU or not, streamed or not, whether the update runs beside
the next forward pass, which clock times a step) is derived from it, never stored beside
it, so the modes cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ...base.errors import InvalidRequestError
from ...base.values import count, flag, lookahead as checked_lookahead, word

MAX_BLOCKS = 4096  # as pycxl.fit's layers
Update = Literal["auto", "cpu", "gpu"]
Weights = Literal["resident", "stream"]


@dataclass(frozen=True)
class OffloadConfig:
    """``device``: a torch.device; ``weights``: resident on it or streamed from the
    tier; ``update``: where blocks are updated ("auto": split by measured rates);
    ``overlap``: step() returns while the update runs (on a GPU); ``update_in_backward``:
    the update begins in the backward pass; ``lookahead``: blocks copied ahead, streamed;
    ``hbm_blocks``: the first blocks whose state lives in the device's memory, updated
    there, their weights resident in either mode (nothing of theirs crosses the link)."""

    device: Any
    weights: Weights = "resident"
    update: Update = "auto"
    overlap: bool = True
    update_in_backward: bool = False
    lookahead: int = 1
    hbm_blocks: int = 0

    @classmethod
    def checked(
        cls,
        device: Any,
        *,
        weights: object = "resident",
        update: object = "auto",
        overlap: object = True,
        update_in_backward: object = False,
        lookahead: object = 1,
        hbm_blocks: object = 0,
    ) -> OffloadConfig:
        """The configuration from what a caller gave, each value checked, and the
        combinations that cannot work refused by name."""
        config = cls(
            device,
            weights=word(weights, "weights", ("resident", "stream")),  # type: ignore[arg-type]
            update=word(update, "update", ("auto", "cpu", "gpu")),  # type: ignore[arg-type]
            overlap=flag(overlap, "overlap"),
            update_in_backward=flag(update_in_backward, "update_in_backward"),
            lookahead=checked_lookahead(lookahead),
            hbm_blocks=count(hbm_blocks, "hbm_blocks", 0, MAX_BLOCKS),
        )
        if config.update == "gpu" and not config.on_gpu:
            raise InvalidRequestError("update='gpu' needs a GPU: name one, or use 'cpu'")
        if config.hbm_blocks and not config.on_gpu:
            raise InvalidRequestError("hbm_blocks keeps state in a GPU's memory: name a GPU")
        return config

    @property
    def on_gpu(self) -> bool:
        """Trained on a GPU (else on the CPU, the update all on the CPU)."""
        return bool(self.device.type == "cuda")

    @property
    def streamed(self) -> bool:
        """The blocks' weights live on the tier and visit the device as they run."""
        return self.weights == "stream"

    @property
    def overlaps(self) -> bool:
        """step() returns while the update runs beside the next forward pass."""
        return self.overlap and self.on_gpu

    @property
    def fixed(self) -> bool:
        """The split was chosen, not measured: step timings do not move it."""
        return self.update != "auto"

    @property
    def device_clock(self) -> bool:
        """Resident on a GPU, a step's times are taken on the device's clock (the host
        runs ahead of it); elsewhere on the host's."""
        return self.on_gpu and not self.streamed

    @property
    def gpu_begins_in_backward(self) -> bool:
        """Whether the GPU side may begin blocks in the backward pass too (resident
        weights; streamed ones are still on their way home then)."""
        return self.update_in_backward and not self.streamed
