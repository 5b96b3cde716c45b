"""pycxl bench latency|bandwidth|first-touch: a tier measured from CPUs or a GPU, through
the one dispatcher (pycxl.bench.dispatch) that the library and the matrix use too."""

from __future__ import annotations

import click

from ..params import CHASE_SIZE, INT_LIST, PAGE_SIZE
from .options import AS_JSON, FROM, PAGE, PLOT, TARGET, samples_option
from .plots import plot_bandwidth, plot_latency
from .progress import bar
from .tables import emit_results


@click.command("latency")
@TARGET
@FROM
@click.option("--size", type=CHASE_SIZE, default=None,
              help="Arena (default: 4x the last-level cache, at least 256M; "
                   "with --sweep: the largest working set).")  # fmt: skip
@PAGE
@click.option("--sweep", is_flag=True, help="Working sets from 16K to beyond the caches.")
@samples_option(None, "Timed samples, best and median kept (default: 7; GPU 5; sweep 3).")
@AS_JSON
@PLOT
def latency_command(target: str, initiator: str | None, size: int | None, page: str,
                    sweep: bool, samples: int | None, as_json: bool,
                    plot: str | None) -> None:  # fmt: skip
    """Idle load-to-use latency (dependent-load pointer chase).

    A GPU measures its own memory (--target gpu0) or host memory mapped for it
    (--from gpu0 --target cxl0)."""
    from pycxl.bench import dispatch

    results = dispatch.measure_latency(target, initiator, size=size, page=page, samples=samples,
                                       sweep=sweep, progress=bar(as_json, "sweep"))  # fmt: skip
    emit_results(results, as_json)
    if plot:
        plot_latency(plot, results)


@click.command("bandwidth")
@TARGET
@FROM
@click.option("--threads", type=INT_LIST, default=None,
              help="Threads (default: the initiator's CPUs); 1,2,4 sweeps.")  # fmt: skip
@click.option("--kernel", type=click.Choice(["copy", "scale", "add", "triad", "all"]),
              default="all", show_default=True)  # fmt: skip
@click.option("--size", type=PAGE_SIZE, default=None,
              help="Bytes per array (default: 4x the last-level cache, at least 64M; "
                   "GPU memory 1G).")  # fmt: skip
@samples_option(None, "Timed passes after one untimed pass (default: 10; GPU 20).")
@click.option("--nt-stores", is_flag=True, help="Non-temporal stores (no write-allocate read).")
@click.option("--mix", default=None, metavar="MIX[,MIX...]|all",
              help="Peak bandwidth of read/write mixes instead of STREAM (MLC's peak "
                   "injection bandwidth): read, 3:1, 2:1, 1:1, nt-write, all.")  # fmt: skip
@click.option("--zero-copy", is_flag=True,
              help="With a GPU as --from: its STREAM kernels on arrays on the host tier, "
                   "read and written in place over its link (not a copy).")  # fmt: skip
@AS_JSON
@PLOT
def bandwidth_command(target: str, initiator: str | None, threads: tuple[int, ...] | None,
                      kernel: str, size: int | None, samples: int | None, nt_stores: bool,
                      mix: str | None, zero_copy: bool, as_json: bool,
                      plot: str | None) -> None:  # fmt: skip
    """Sustainable bandwidth (STREAM copy, scale, add, triad).

    In a GPU's own memory with --target gpu0; --from gpu0 with a host target measures
    the GPU's pinned copy from that memory, and with --zero-copy its STREAM kernels on
    that memory in place."""
    from pycxl.bench import dispatch

    results = dispatch.measure_bandwidth(
        target, initiator, threads=threads, kernel=kernel, size=size, samples=samples,
        nt_stores=nt_stores, mix=mix, zero_copy=zero_copy, progress=bar(as_json, "threads"),
    )  # fmt: skip
    emit_results(results, as_json)
    if plot:
        plot_bandwidth(plot, results)  # type: ignore[arg-type]  # CPU and GPU rates alike


@click.command("first-touch")
@TARGET
@FROM
@click.option("--size", type=PAGE_SIZE, default=None, help="Buffer size (default: 64M).")
@PAGE
@AS_JSON
def first_touch_command(target: str, initiator: str | None, size: int, page: str,
                        as_json: bool) -> None:  # fmt: skip
    """Per-page first-write latency and throughput."""
    from pycxl.bench import dispatch

    emit_results(dispatch.measure_first_touch(target, initiator, size=size, page=page), as_json)
