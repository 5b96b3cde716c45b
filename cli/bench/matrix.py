"""pycxl bench matrix: every initiator x every tier, and its tables."""

from __future__ import annotations

from typing import Any

import click

from ..params import PAGE_SIZE
from ..render import emit_json, emit_table
from .options import AS_JSON
from .progress import bar
from .tables import cache_fit, ns, rate, say_cached


@click.command("matrix")
@click.option("--latency/--no-latency", default=True, show_default=True)
@click.option("--bandwidth/--no-bandwidth", default=False, show_default=True)
@click.option("--loaded", is_flag=True,
              help="Also the latency at 50% and 90% of each tier's peak read "
                   "bandwidth.")  # fmt: skip
@click.option("--gpus/--no-gpus", default=True, show_default=True,
              help="GPUs as initiators and targets.")  # fmt: skip
@click.option("--size", type=PAGE_SIZE, default=None,
              help="Arena / array size per cell (default: each benchmark's).")  # fmt: skip
@AS_JSON
def matrix_command(latency: bool, bandwidth: bool, loaded: bool, gpus: bool,
                   size: int | None, as_json: bool) -> None:  # fmt: skip
    """Every initiator (nodes with CPUs, GPUs) x every memory tier (nodes, GPU memory).

    GPU rows: latency is the GPU's own chase (zero-copy to host tiers); bandwidth is
    the pinned copy to the GPU from a host tier, and STREAM triad in its own memory."""
    from pycxl.bench.matrix import measure_matrix

    if not (latency or bandwidth or loaded):
        raise click.UsageError("--no-latency and --no-bandwidth leave nothing to measure")
    m = measure_matrix(
        latency=latency, bandwidth=bandwidth, loaded=loaded, size=size,
        gpus=gpus, progress=bar(as_json, "matrix"),
    )  # fmt: skip
    if as_json:
        from pycxl.bench.matrix import matrix_cell_json

        emit_json([matrix_cell_json(c) for c in m.cells])
        return
    titles = {"latency": "latency", "bandwidth": "bandwidth",
              "loaded": "latency at 50% / 90% of peak read bandwidth"}  # fmt: skip
    for kind in ("latency", "bandwidth", "loaded"):
        if not any(c.kind == kind for c in m.cells):
            continue
        rows = [[i] + [_cell(m, i, t, kind) for t in m.targets] for i in m.initiators]
        emit_table(f"{titles[kind]} (initiator x target)", ["", *m.targets], rows)
        if kind != "loaded":
            say_cached([c.result for c in m.cells if c.kind == kind])


def _cell(m: Any, i: str, t: str, kind: str) -> str:
    c = m.cell(i, t, kind)
    if c is None:
        return "-"
    r = c.result
    cached = "*" if cache_fit(r) is not None else ""  # as the other tables mark a size that fits
    if kind == "latency":
        return ns(r.latency_ns) + cached
    if kind == "bandwidth":
        return rate(r.bytes_per_s) + cached
    paced = sorted((p for p in r.points if p.target_bytes_per_s is not None),
                   key=lambda p: p.target_bytes_per_s)  # fmt: skip
    marks = [f"{p.latency_ns_p50:.0f}" + ("" if p.reached else "*") for p in paced]
    return " / ".join(marks) + " ns"  # *: the load fell short of that fraction
