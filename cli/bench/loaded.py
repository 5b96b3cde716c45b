"""pycxl bench loaded-latency: latency while a paced load runs, and its table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from pycxl.base.values import MAX_STEPS

from ..params import CHASE_SIZE, COUNT, PAGE_SIZE, SECONDS, CountType, FiniteType, RatesType
from ..render import emit_json, emit_table
from .options import AS_JSON, FROM, PLOT, TARGET
from .plots import plot_loaded

if TYPE_CHECKING:
    from pycxl.measure.results import LoadedLatencyResult


@click.command("loaded-latency")
@TARGET
@FROM
@click.option("--load-on", default=None, metavar="TARGET",
              help="Tier the load runs on (default: the target).")  # fmt: skip
@click.option("--load-from", default=None, metavar="GPU|all",
              help="Load from a GPU's copy engines (gpu0), or every GPU's at once (all), "
                   "instead of CPUs.")  # fmt: skip
@click.option("--mix", default="read", show_default=True, metavar="MIX[,MIX...]|all",
              help="Load read/write mix: read, 3:1, 2:1, 1:1, nt-write, all.")  # fmt: skip
@click.option("--rates", type=RatesType(), default=None, metavar="GB/S[,GB/S...]",
              help="Load bandwidths to pace to (default: a sweep from idle to the "
                   "peak).")  # fmt: skip
@click.option("--steps", type=CountType(minimum=2, maximum=MAX_STEPS), default=None,
              help="Points of the automatic sweep (default: 10).")  # fmt: skip
@click.option("--load-threads", type=COUNT, default=None,
              help="CPU load threads (default: every CPU of the initiator but the chase's "
                   "core).")  # fmt: skip
@click.option("--size", type=CHASE_SIZE, default=None,
              help="Chase arena (default: as pycxl bench latency).")  # fmt: skip
@click.option("--load-size", type=PAGE_SIZE, default=None,
              help="Load buffer, all threads (default: 4x the last-level cache, at least "
                   "256M).")  # fmt: skip
@click.option("--duration", type=SECONDS, default=None,
              help="Chase time per point (default: 1).")  # fmt: skip
@click.option("--knee", type=FiniteType(above=1, metavar="FACTOR"), default=None,
              help="Latency factor over idle that marks the knee (default: 1.5).")  # fmt: skip
@AS_JSON
@PLOT
def loaded_latency_command(
    target: str, initiator: str | None, load_on: str | None, load_from: str | None, mix: str,
    rates: tuple[float, ...] | None, steps: int | None, load_threads: int | None,
    size: int | None, load_size: int | None, duration: float | None, knee: float | None,
    as_json: bool, plot: str | None,
) -> None:  # fmt: skip
    """Latency while the memory is busy (MLC's loaded latency, paced by bandwidth).

    One thread chases pointers on TARGET while load threads on the initiator's other
    CPUs (or GPUs' copy engines, --load-from gpu0|all) move memory on --load-on at a
    series of bandwidths: the unpaced peak first, then paced points from idle up. Each
    point: the load bandwidth reached, the chase latency (mean, p50, p99). --from gpu0
    makes the chase the GPU's (zero-copy) while CPUs load the tier.
    """
    from pycxl.bench import dispatch

    results = dispatch.measure_loaded_latency(
        target, initiator, load_on=load_on, load_from=load_from, mix=mix,
        rates=list(rates) if rates else None, steps=steps, size=size, load_size=load_size,
        load_threads=load_threads, seconds=duration, knee=knee,
    )  # fmt: skip
    if as_json:
        from pycxl.measure.results import bench_result_json

        emit_json([bench_result_json(r) for r in results])
    else:
        for r in results:
            _loaded_table(r)
    if plot:
        plot_loaded(plot, results)


def _loaded_table(r: LoadedLatencyResult) -> None:
    gpu_load = bool(r.load_gpus)
    who = r.load_from if gpu_load else f"{r.load_from} ({len(r.load_cpus)} threads)"
    title = (f"loaded latency: {r.target} from {r.initiator}"
             f"{f' (cpu{r.cpus[0]})' if r.cpus else ''}; load {r.mix} "
             f"({r.reads}:{r.writes} reads:writes) on {r.load_target} from {who}")  # fmt: skip
    rows = []
    for p in r.points:
        if p.target_bytes_per_s is None:
            asked = "unpaced" if p.unpaced else "idle"
        else:
            asked = f"{p.target_bytes_per_s / 1e9:.2f}"
        rows.append([
            asked, f"{p.achieved_bytes_per_s / 1e9:.2f}",
            "-" if p.achieved_ratio is None else f"{p.achieved_ratio:.2f}",
            f"{p.latency_ns:.1f}", f"{p.latency_ns_p50:.1f}", f"{p.latency_ns_p99:.1f}",
            "yes" if p.reached else "no: fell short",
        ])  # fmt: skip
    emit_table(title, ["load GB/s", "reached GB/s", "ratio", "latency_ns", "p50_ns", "p99_ns",
                       "reached"], rows)  # fmt: skip
    knee = ("not reached" if r.knee_bytes_per_s is None
            else f"at {r.knee_bytes_per_s / 1e9:.2f} GB/s")  # fmt: skip
    click.echo(f"idle {r.idle_latency_ns:.1f} ns; peak {r.peak_bytes_per_s / 1e9:.2f} GB/s; "
               f"knee ({r.knee_factor:g}x idle) {knee}\n")  # fmt: skip
