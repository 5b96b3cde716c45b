"""Weighted-interleave weights from measurement: each tier's bandwidth, measured from one
socket's CPUs, turned into weights by the kernel's own rule (``numa.weights``), and set
through a plan (shown by a dry run, undone if a write fails).

The weights are system-wide (one per node, whoever allocates); the socket whose CPUs
measure should be the one the interleaving programs run on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base.errors import InvalidRequestError
from ..base.plan import Plan
from ..base.sysfs import Sysfs
from ..measure.results import BandwidthResult
from ..numa.policy import read_weight_mode, read_weights, weights_plan
from ..numa.weights import RULE, weights_from_bandwidth
from ..resolve.system import System, given_or_read

Names = str | int | list[str | int] | tuple[str | int, ...]
KERNEL = "triad"  # STREAM's triad: two reads and a write per element


@dataclass(frozen=True)
class TierBandwidth:
    """One tier's measured bandwidth from the tuning socket's CPUs."""

    name: str
    node: int
    result: BandwidthResult

    @property
    def bytes_per_s(self) -> float:
        """The best pass, as bench bandwidth reports it."""
        return self.result.bytes_per_s


@dataclass(frozen=True)
class WeightTuning:
    """What was measured, the weights derived from it, what they replace, and the plan
    that sets them. ``mode``: the kernel's weight mode before ('auto': it derived them
    itself, Linux 6.16+; 'manual')."""

    initiator: str
    cpus: tuple[int, ...]
    measured: tuple[TierBandwidth, ...]
    weights: dict[int, int] = field(hash=False)
    previous: dict[int, int] = field(hash=False)
    mode: str | None
    plan: Plan
    rule: str = RULE

    @property
    def turns_auto_off(self) -> bool:
        """Whether setting the weights ends the kernel's auto mode."""
        return self.mode == "auto"

    def names(self, weights: dict[int, int]) -> str:
        """'dram0=5,cxl0=1': weights as ``pycxl numa --set-weights`` takes them."""
        by_node = {t.node: t.name for t in self.measured}
        return ",".join(f"{by_node.get(n, n)}={w}" for n, w in weights.items())


def plan_weights(
    nodes: Names | None = None,
    initiator: str | None = None,
    *,
    size: int | str | None = None,
    samples: int | None = None,
    system: System | None = None,
    fs: Sysfs | None = None,
) -> WeightTuning:
    """Measure the bandwidth of ``nodes`` (default: the tiers nearest the initiator: its
    socket's DRAM and CXL) from ``initiator``'s CPUs (a node with CPUs; default: the one
    nearest the first node, else dram0) and derive their weights. Nothing is set: run
    ``apply_weights`` on the result (or read its plan)."""
    from ..bench.dispatch import measure_bandwidth

    s = given_or_read(system, gpus=False)
    s.require_live("tuning weights (it measures bandwidth)")
    fs = fs or Sysfs()
    previous = read_weights(fs)  # NotAvailableError on kernels without weighted interleave
    if initiator is None:
        first = s.memory_nodes(nodes)[0] if nodes is not None else s.resolve("dram0").node
        assert first is not None
        initiator = s.nearest_cpu_node(first).name
    init = s.resolve(initiator, initiator=True)
    tier = s.tier(init.node) if init.kind == "node" and init.node is not None else None
    if tier is None or not tier.node.cpus:
        raise InvalidRequestError(
            f"weights are measured from a socket: '{initiator}' must be a node with CPUs "
            "(dram0, dram1)"
        )
    ids = s.memory_nodes(nodes) if nodes is not None else tuple(
        t.node.id for t in s.near_tiers(tier.node.id)
    )  # fmt: skip
    if len(ids) < 2:
        raise InvalidRequestError(
            f"weighted interleave needs at least two nodes; {initiator}'s socket has "
            f"{len(ids)} with memory: name them (dram0,cxl0)"
        )
    measured = []
    for node in ids:
        name = s.tier_name(node) or f"node{node}"
        (r,) = measure_bandwidth(name, initiator, kernel=KERNEL, size=size, samples=samples,
                                 system=s)  # fmt: skip
        assert isinstance(r, BandwidthResult)
        measured.append(TierBandwidth(name, node, r))
    weights = weights_from_bandwidth({t.node: t.bytes_per_s for t in measured})
    return WeightTuning(
        initiator=init.name,
        cpus=measured[0].result.cpus,
        measured=tuple(measured),
        weights=weights,
        previous={n: previous[n] for n in weights if n in previous},
        mode=read_weight_mode(fs),
        plan=weights_plan(weights, fs),
    )


def apply_weights(tuning: WeightTuning, fs: Sysfs | None = None) -> None:
    """Set the tuned weights (root): the plan's writes in order, undone if one fails."""
    tuning.plan.execute(fs or Sysfs())
