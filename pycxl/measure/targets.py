"""What names resolve to, as typed objects the floors below the resolver take: a
``Target`` (NUMA node memory with its tier, a GPU, or one CPU) and a ``Pair`` (an
initiator and the memory it reaches, with the CPUs that run the accesses).

``System`` (pycxl.resolve.system) makes them, once per name per command; nothing that takes
them parses a name again: what a name is (tier, GPU, node) travels with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..base.errors import InvalidRequestError, PlacementError
from ..base.units import format_size

if TYPE_CHECKING:
    from ..gpu.inventory import GpuDevice


@dataclass(frozen=True)
class Target:
    """What a target or initiator name resolved to."""

    name: str
    kind: Literal["node", "gpu", "cpu"]
    node: int | None = None  # the NUMA node (for a GPU: its nearest host node)
    tier: str | None = None  # 'dram', 'cxl', 'cpuless', 'gpu'
    gpu: GpuDevice | None = None
    cpu: int | None = None

    @property
    def is_gpu(self) -> bool:
        """Whether this is a GPU (its memory, as a target; the GPU, as an initiator)."""
        return self.kind == "gpu"


@dataclass(frozen=True)
class Pair:
    """An initiator and the memory it reaches, resolved: ``target`` is host memory on a
    node or a GPU's own memory; ``initiator`` is CPUs (a node's, or one CPU) or a GPU
    (for a GPU's own memory, the GPU itself). ``cpus`` run the accesses: the
    initiator's, or for a GPU initiator the CPUs nearest the target (which load it or
    copy for it). ``free``: the target node's available memory (free + reclaimable)."""

    target: Target
    initiator: Target
    cpus: tuple[int, ...] = ()
    free: int = 0

    @property
    def gpu(self) -> GpuDevice | None:
        """The GPU that does the accesses, if a GPU does."""
        return self.initiator.gpu if self.initiator.is_gpu else None

    @property
    def in_gpu_memory(self) -> bool:
        """Whether the memory is a GPU's own (measured from that GPU)."""
        return self.target.is_gpu

    @property
    def node(self) -> int:
        """The NUMA node of the host memory (a GPU's own memory has none)."""
        if self.target.is_gpu or self.target.node is None:
            raise InvalidRequestError(f"{self.target.name} is GPU memory, not a NUMA node's")
        return self.target.node

    def check_fits(self, size: int) -> None:
        """Refuse a working set the target node cannot hold (its available memory)."""
        if size > self.free:
            raise InvalidRequestError(
                f"{format_size(size)} does not fit on {self.target.name} (node {self.node}): "
                f"{format_size(self.free)} available; pass a smaller --size"
            )

    def require_placed(self, placed: dict[int, int], what: str) -> None:
        """Refuse to report a figure for memory that was not on the target's node."""
        total = sum(n for node, n in placed.items() if node >= 0)
        on = placed.get(self.node, 0)
        if on < total:
            elsewhere = {n: c for n, c in placed.items() if n >= 0 and n != self.node}
            raise PlacementError(
                f"{total - on} of {total} pages of the {what} were not on {self.target.name} "
                f"(node {self.node}) but on {elsewhere}; no figure is reported for "
                f"{self.target.name}"
            )

    def result_fields(
        self, pages: dict[int, int] | None = None, cpus: Sequence[int] | None = None
    ) -> dict[str, Any]:
        """What every result says of where it was measured: the target and initiator
        names (and the pair itself), the node (None for GPU memory), the CPUs that ran it
        (default: the pair's; none for a GPU) and, from ``pages`` per node, how many sat
        on the node."""
        node = None if self.in_gpu_memory else self.node
        ran = () if self.gpu is not None else self.cpus if cpus is None else cpus
        return {
            "target": self.target.name, "node": node, "initiator": self.initiator.name,
            "pair": self, "cpus": tuple(ran),
            "pages_on_node": None if pages is None or node is None else pages.get(node, 0),
            "pages": None if pages is None else sum(pages.values()),
        }  # fmt: skip
