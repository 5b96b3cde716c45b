"""What the spill did, for the summary ``pycxl spill`` prints at exit: HBM's peak, the
tier's bytes by kind, the allocations that spilled, and where their pages were."""

from __future__ import annotations

from dataclasses import dataclass

from ..base._lib import compiled
from ..base.units import format_size
from ..gpu.tier_pool import TierPool
from ..numa.nodes import read_nodes


@dataclass(frozen=True)
class SpillReport:
    """One CUDA device of a spilling process. Bytes are what the program asked for;
    ``*_peak`` since the start (or PyTorch's last ``reset_peak_memory_stats``)."""

    device: int
    tier: str
    node: int
    hbm_peak: int
    tier_now: int
    tier_peak: int
    state_on_tier_now: int  # the optimizer state the placement made on the tier
    state_on_tier_peak: int
    saved_on_tier_peak: int  # activations the backward pass needs, kept there between
    spilled_peak: int  # what HBM refused and no placement chose: kernels work on it there
    spilled: int  # allocations the GPU's memory could not take, sent to the tier
    refused: int  # allocations the tier refused too (out-of-memory reached the program)
    misplaced_pages: int  # pages found off the tier's node (such mappings are refused)
    last_refusal: str
    steps: int  # optimizer steps the process made
    saved_sent: int  # bytes of saved activations sent to the tier, ever
    node_available: int = -1  # bytes the tier's node has available now, where it refused

    def lines(self) -> list[str]:
        """The summary's lines, as ``pycxl spill`` prints them at exit."""
        out = [
            f"cuda:{self.device}: HBM peak {format_size(self.hbm_peak)}; on {self.tier} "
            f"(node {self.node}) {format_size(self.tier_now)} now, "
            f"{format_size(self.tier_peak)} at peak",
            f"  optimizer state {format_size(self.state_on_tier_peak)} at peak, saved "
            f"activations {format_size(self.saved_on_tier_peak)}, other (spilled) "
            f"{format_size(self.spilled_peak)}; "
            f"{self.spilled} allocations spilled, {self.misplaced_pages} pages off node "
            f"{self.node}",
        ]
        if self.steps and (self.state_on_tier_now or self.saved_sent):
            # what crosses the link each step for what was placed on the tier: the
            # optimizer reads and writes its state there, saved activations go and return
            out.append(
                f"  over the link a step (mean of {self.steps}): optimizer state "
                f"{format_size(2 * self.state_on_tier_now)} read and written, saved "
                f"activations {format_size(2 * self.saved_sent // self.steps)} out and back"
            )
        if self.refused:
            now = (f"; node {self.node} has {format_size(self.node_available)} available now"
                   if self.node_available >= 0 else "")  # fmt: skip
            out.append(f"  {self.refused} refused by {self.tier} too: {self.last_refusal}{now}")
        return out


def report(pool: TierPool, device: int, steps: int) -> SpillReport:
    """The spill onto ``pool`` seen from CUDA ``device`` now, after ``steps`` optimizer
    steps."""
    figures, _ = compiled.tier_use(device)
    stats = pool.stats()
    available = -1
    if stats.refused:  # what the node could still give, beside what it refused
        node = next((n for n in read_nodes() if n.id == pool.node), None)
        available = node.mem_available if node is not None else -1
    return SpillReport(
        device=device, tier=pool.tier, node=pool.node, hbm_peak=figures["hbm_bytes"][1],
        tier_now=figures["tier_bytes"][0], tier_peak=figures["tier_bytes"][1],
        state_on_tier_now=figures["tier_state_bytes"][0],
        state_on_tier_peak=figures["tier_state_bytes"][1],
        saved_on_tier_peak=figures["tier_saved_bytes"][1],
        spilled_peak=figures["tier_other_bytes"][1], spilled=stats.gpu_refusals,
        refused=stats.refused, misplaced_pages=stats.misplaced_pages,
        last_refusal=stats.last_error, steps=steps, saved_sent=figures["tier_saved_bytes"][2],
        node_available=available,
    )  # fmt: skip
