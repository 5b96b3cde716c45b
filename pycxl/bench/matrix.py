"""The initiator x target matrix (MLC's idle-latency and bandwidth matrices), with
GPUs: every node with CPUs and every GPU as initiators; every node with memory and
every GPU's own memory as targets.

A cell measures what that initiator can do to that target: CPUs chase and run STREAM
triad on host memory; a GPU chases its own memory and host memory mapped for it, runs
STREAM triad in its own memory, and copies from host tiers (pinned, to the GPU). CPUs
do not load from GPU memory and GPUs are not measured against each other's memory:
those cells stay empty.
"""

from __future__ import annotations

from dataclasses import replace

from ..system import System
from ..tiers import is_gpu_name
from .results import BenchResult

Cell = tuple[str, str]


def matrix_cells(s: System) -> tuple[list[str], list[str], list[Cell]]:
    """(initiators, targets, cells that can be measured)."""
    gpus = [g.target_name for g in s.gpus.devices]
    cpu_inits = [n.name for n in s.nodes if n.node.cpus]
    host_targets = [n.name for n in s.nodes if n.node.has_memory]
    cells = [(i, t) for i in cpu_inits for t in host_targets]
    cells += [(g, t) for g in gpus for t in [*host_targets, g]]
    return cpu_inits + gpus, host_targets + gpus, cells


def measure_cell(
    cell: Cell, s: System, *, latency: bool, bandwidth: bool, size: int | None = None
) -> list[BenchResult]:
    """The latency and/or bandwidth results of one cell, tagged params["matrix"]."""
    i, t = cell
    out: list[BenchResult] = []
    if is_gpu_name(i):
        from .gpu_latency import measure_gpu_latency

        if latency:
            out.append(_tag(measure_gpu_latency(i, t, size=size, samples=3, system=s), "latency"))
        if bandwidth:
            out.append(_tag(_gpu_bandwidth(i, t, size), "bandwidth"))
        return out
    from .bandwidth import measure_bandwidth
    from .context import place
    from .latency import measure_latency

    p = place(t, i, s)
    if latency:
        out.append(_tag(measure_latency(t, size=size, samples=3, placement=p), "latency"))
    if bandwidth:
        triad = measure_bandwidth(t, kernel="triad", size=size, ntimes=5, placement=p)
        out += [_tag(r, "bandwidth") for r in triad]
    return out


def _gpu_bandwidth(gpu: str, target: str, size: int | None) -> BenchResult:
    if target == gpu:
        from .gpu_stream import measure_gpu_bandwidth

        return measure_gpu_bandwidth(gpu, kernel="triad", size=size or 1 << 30, ntimes=5)[0]
    from .transfer import measure_transfer

    return measure_transfer(gpu, target, direction="h2d", size=size or 256 << 20, iterations=5)[0]


def _tag(r: BenchResult, kind: str) -> BenchResult:
    return replace(r, params={**r.params, "matrix": kind})
