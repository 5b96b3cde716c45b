"""pycxl bench latency|bandwidth|first-touch|matrix."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click

from pycxl.bench.results import BenchResult
from pycxl.tiers import is_gpu_name
from pycxl.units import format_size, parse_size

from .render import emit_json, emit_table

AS_JSON = click.option("--json", "as_json", is_flag=True, help="A list of result objects.")
FROM = click.option(
    "--from",
    "initiator",
    default=None,
    metavar="INITIATOR",
    help="Who accesses: dram0, node0, cpu3 (default: CPUs nearest the target).",
)
PAGE = click.option(
    "--page-size", "page", type=click.Choice(["4k", "2m"]), default="4k", show_default=True
)
PLOT = click.option("--plot", default=None, metavar="FILE.png", help="Draw the results.")


@click.group("bench")
def bench_group() -> None:
    """Measure memory tiers: latency, bandwidth, first touch."""


def _size(text: str | None) -> int | None:
    return parse_size(text) if text else None


@bench_group.command("latency")
@click.option("--target", "-t", required=True, help="Memory to measure: dram0, cxl0, node1.")
@FROM
@click.option("--size", default=None, help="Arena size (default: 4x LLC, at least 256M).")
@PAGE
@click.option("--sweep", is_flag=True, help="Working sets from 16K to beyond the LLC.")
@click.option("--samples", default=7, show_default=True, type=int)
@AS_JSON
@PLOT
def latency_command(
    target: str,
    initiator: str | None,
    size: str | None,
    page: str,
    sweep: bool,
    samples: int,
    as_json: bool,
    plot: str | None,
) -> None:
    """Idle load-to-use latency (dependent-load pointer chase).

    A GPU measures its own memory (--target gpu0) or host memory mapped for it
    (--from gpu0 --target cxl0)."""
    if is_gpu_name(target) or (initiator is not None and is_gpu_name(initiator)):
        results = _gpu_latency(target, initiator, size, page, sweep, samples, as_json)
    else:
        results = _cpu_latency(target, initiator, size, page, sweep, samples, as_json)
    _emit(results, as_json, ["latency_ns", "latency_ns_median"])
    if plot:
        _plot(plot, results, "size", "latency_ns", "working set (bytes)", "ns per load")


def _cpu_latency(target: str, initiator: str | None, size: str | None, page: str,
                 sweep: bool, samples: int, quiet: bool) -> list[BenchResult]:  # fmt: skip
    from pycxl.bench.context import place
    from pycxl.bench.latency import measure_latency, sweep_sizes

    p = place(target, initiator)
    if not sweep:
        return [measure_latency(target, size=_size(size), page=page, samples=samples, placement=p)]
    return _progress(
        sweep_sizes(_size(size)),
        quiet,
        "sweep",
        lambda s: measure_latency(target, size=s, page=page, samples=3, placement=p, loads=1 << 20),
    )


def _gpu_latency(target: str, initiator: str | None, size: str | None, page: str,
                 sweep: bool, samples: int, quiet: bool) -> list[BenchResult]:  # fmt: skip
    from pycxl.bench.gpu_latency import gpu_sweep_sizes, measure_gpu_latency
    from pycxl.errors import InvalidRequestError

    if initiator is None:
        gpu = target
    elif is_gpu_name(initiator):
        gpu = initiator
    else:
        raise InvalidRequestError(
            f"{initiator} cannot load from GPU memory: measure {target} from itself "
            f"(--target {target}) or host memory from it (--from {target} --target dram0)"
        )
    if not sweep:
        return [measure_gpu_latency(gpu, target, size=_size(size), page=page, samples=samples)]
    return _progress(
        gpu_sweep_sizes(gpu, _size(size)),
        quiet,
        "sweep",
        lambda s: measure_gpu_latency(gpu, target, size=s, page=page, samples=3, loads=1 << 16),
    )


@bench_group.command("bandwidth")
@click.option("--target", "-t", required=True)
@FROM
@click.option(
    "--threads",
    default=None,
    help="Threads (default: the initiator's CPUs); a list such as 1,2,4 sweeps.",
)
@click.option(
    "--kernel",
    type=click.Choice(["copy", "scale", "add", "triad", "all"]),
    default="all",
    show_default=True,
)
@click.option("--size", default=None, help="Bytes per array (default: 4x LLC, at least 64M).")
@click.option("--ntimes", default=10, show_default=True, type=int)
@click.option("--nt-stores", is_flag=True, help="Non-temporal stores (no write-allocate read).")
@AS_JSON
@PLOT
def bandwidth_command(
    target: str,
    initiator: str | None,
    threads: str | None,
    kernel: str,
    size: str | None,
    ntimes: int,
    nt_stores: bool,
    as_json: bool,
    plot: str | None,
) -> None:
    """Sustainable bandwidth (STREAM copy, scale, add, triad)."""
    from pycxl.bench.bandwidth import measure_bandwidth
    from pycxl.bench.context import place

    if is_gpu_name(target):  # STREAM in the GPU's own memory
        from pycxl.bench.gpu_stream import measure_gpu_bandwidth

        gpu_results = measure_gpu_bandwidth(
            target, kernel=kernel, size=_size(size) or 1 << 30, ntimes=ntimes
        )
        _emit(gpu_results, as_json, ["bytes_per_s", "bytes_per_s_median"])
        return
    p = place(target, initiator)
    counts = [int(t) for t in threads.split(",")] if threads else [None]
    results: list[BenchResult] = []
    for r in _progress(
        counts,
        as_json,
        "threads",
        lambda n: measure_bandwidth(
            target,
            threads=n,
            kernel=kernel,
            size=_size(size),
            ntimes=ntimes,
            nt_stores=nt_stores,
            placement=p,
        ),
    ):
        results += r
    _emit(results, as_json, ["bytes_per_s", "bytes_per_s_median"])
    if plot:
        _plot(plot, results, "threads", "bytes_per_s", "threads", "bytes/s")


@bench_group.command("first-touch")
@click.option("--target", "-t", required=True)
@FROM
@click.option("--size", default="64M", show_default=True)
@PAGE
@AS_JSON
def first_touch_command(
    target: str, initiator: str | None, size: str, page: str, as_json: bool
) -> None:
    """Per-page first-write latency and throughput."""
    from pycxl.bench.first_touch import measure_first_touch

    r = measure_first_touch(target, initiator=initiator, size=parse_size(size), page=page)
    _emit([r], as_json, ["p50_ns", "p90_ns", "p99_ns", "max_ns", "bytes_per_s"])


@bench_group.command("transfer")
@click.option("--gpu", "-g", required=True, help="GPU: gpu0, gpu1..., or all (at once).")
@click.option("--target", "-t", required=True, help="Host memory: dram0, cxl0, node1.")
@click.option(
    "--direction",
    type=click.Choice(["h2d", "d2h", "both", "bidir"]),
    default="both",
    show_default=True,
    help="both: one after the other; bidir: at once.",
)
@click.option("--pageable", is_flag=True, help="Unpinned memory, the driver's own copy.")
@click.option("--staged", is_flag=True, help="Unpinned memory, pycxl's pipelined copy.")
@click.option("--size", default="1G", show_default=True)
@click.option("--iterations", default=20, show_default=True, type=int)
@AS_JSON
def transfer_command(
    gpu: str,
    target: str,
    direction: str,
    pageable: bool,
    staged: bool,
    size: str,
    iterations: int,
    as_json: bool,
) -> None:
    """Copy bandwidth between GPUs and host memory on a tier."""
    from pycxl.bench.transfer import measure_transfer

    results = measure_transfer(
        gpu,
        target,
        direction=direction,
        size=parse_size(size),
        pageable=pageable,
        staged=staged,
        iterations=iterations,
    )
    _emit(results, as_json, ["bytes_per_s", "bytes_per_s_median"])


@bench_group.command("matrix")
@click.option("--latency/--no-latency", default=True)
@click.option("--bandwidth/--no-bandwidth", default=False)
@click.option("--gpus/--no-gpus", default=True, help="GPUs as initiators and targets.")
@click.option("--size", default=None, help="Arena / array size per cell.")
@AS_JSON
def matrix_command(
    latency: bool, bandwidth: bool, gpus: bool, size: str | None, as_json: bool
) -> None:
    """Every initiator (nodes with CPUs, GPUs) x every memory tier (nodes, GPU memory).

    GPU rows: latency is the GPU's own chase (zero-copy to host tiers); bandwidth is
    the pinned copy to the GPU from a host tier, and STREAM triad in its own memory."""
    from pycxl.bench.matrix import matrix_cells, measure_cell
    from pycxl.system import snapshot

    s = snapshot(gpus=gpus)
    inits, targets, cells = matrix_cells(s)
    results: list[BenchResult] = []
    for r in _progress(
        cells,
        as_json,
        "matrix",
        lambda c: measure_cell(c, s, latency=latency, bandwidth=bandwidth, size=_size(size)),
    ):
        results += r
    if as_json:
        emit_json([r.as_json() for r in results])
        return
    for bench, key, fmt in (
        ("latency", "latency_ns", "{:.1f} ns"),
        ("bandwidth", "bytes_per_s", "{:.2e} B/s"),
    ):
        rows = [
            [i]
            + [
                next(
                    (
                        fmt.format(r.figures[key])
                        for r in results
                        if r.params.get("matrix") == bench and r.initiator == i and r.target == t
                    ),
                    "-",
                )
                for t in targets
            ]
            for i in inits
        ]
        if any(r.params.get("matrix") == bench for r in results):
            emit_table(f"{bench} (initiator x target)", ["", *targets], rows)


def _progress(items: Sequence[Any], quiet: bool, label: str, fn: Callable[[Any], Any]) -> list[Any]:
    if quiet or len(items) < 2:
        return [fn(x) for x in items]
    out = []
    with click.progressbar(items, label=label, file=click.get_text_stream("stderr")) as bar:
        for x in bar:
            out.append(fn(x))
    return out


def _emit(results: list[BenchResult], as_json: bool, keys: list[str]) -> None:
    if as_json:
        emit_json([r.as_json() for r in results])
        return
    rows = []
    for r in results:
        rows.append(
            [
                r.benchmark,
                _variant(r),
                r.target,
                r.node,
                r.initiator,
                len(r.cpus),
                format_size(r.size),
                format_size(r.page_size),
            ]
            + [_fmt(k, r.figures[k]) for k in keys]
        )
    emit_table(
        None, ["bench", "kernel", "target", "node", "from", "cpus", "size", "page", *keys], rows
    )


def _variant(r: BenchResult) -> str:
    """The kernel of a bandwidth result; the direction and memory of a transfer."""
    if "kernel" in r.params:
        return str(r.params["kernel"])
    if "direction" in r.params:
        p = r.params
        memory = "staged" if p.get("staged") else "" if p.get("pinned") else "pageable"
        return f"{p['direction']} {memory}".strip()
    return "-"


def _fmt(key: str, v: float) -> str:
    if key.startswith("bytes_per_s"):
        return f"{v / 1e9:.2f} GB/s"
    return f"{v:.1f}"


def _plot(path: str, results: list[BenchResult], x: str, y: str, xl: str, yl: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from pycxl.errors import NotAvailableError

        raise NotAvailableError("--plot needs matplotlib: pip install 'pycxl[plot]'") from None
    xs = [r.size if x == "size" else len(r.cpus) for r in results]
    fig, ax = plt.subplots()
    ax.plot(xs, [r.figures[y] for r in results], marker="o")
    if x == "size":
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    ax.set_title(f"{results[0].benchmark}: {results[0].target} from {results[0].initiator}")
    fig.savefig(path)
