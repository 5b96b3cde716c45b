"""pycxl bench latency|bandwidth|first-touch|transfer|offload|matrix: measurements by name, through
the one dispatcher (pycxl.bench.dispatch) that the library and the matrix use too."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from pycxl.values import MAX_STEPS, PAGE_SIZES

from .params import (
    CHASE_SIZE,
    COUNT,
    INT_LIST,
    PAGE_SIZE,
    SECONDS,
    CountType,
    FiniteType,
    OutputFileType,
    RatesType,
    plot_suffixes,
)
from .render import emit_json, emit_table

if TYPE_CHECKING:
    from pycxl.measure.results import BenchResult

T = TypeVar("T")

AS_JSON = click.option("--json", "as_json", is_flag=True, help="A list of result objects.")
FROM = click.option(
    "--from",
    "initiator",
    default=None,
    metavar="INITIATOR",
    help="Who accesses: dram0, node0, cpu3, gpu0 (default: CPUs nearest the target).",
)
TARGET = click.option("--target", "-t", required=True, metavar="TARGET",
                      help="Memory to measure: dram0, cxl0, node1, gpu0.")  # fmt: skip
PAGE = click.option(
    "--page-size", "page", type=click.Choice(PAGE_SIZES), default="4k", show_default=True
)
PLOT = click.option("--plot", type=OutputFileType(plot_suffixes), default=None,
                    metavar="FILE.png",
                    help="Draw the results (png, svg, pdf...: any format matplotlib writes; "
                         "the path is checked before measuring).")  # fmt: skip


def samples_option(default: int | None, what: str) -> Callable[[Any], Any]:
    return click.option("-n", "--samples", type=COUNT, default=default,
                        show_default=default is not None, help=what)  # fmt: skip


@click.group("bench")
def bench_group() -> None:
    """Measure memory tiers: latency, bandwidth, first touch, GPU transfers."""


@bench_group.command("latency")
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
                                       sweep=sweep, progress=_bar(as_json, "sweep"))  # fmt: skip
    _emit(results, as_json)
    if plot:
        _plot(plot, results, "size", "latency_ns", "working set (bytes)", "ns per load")


@bench_group.command("bandwidth")
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
        nt_stores=nt_stores, mix=mix, zero_copy=zero_copy, progress=_bar(as_json, "threads"),
    )  # fmt: skip
    _emit(results, as_json)
    if plot:
        _plot(plot, results, "threads", "bytes_per_s", "threads", "bytes/s")


@bench_group.command("loaded-latency")
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
        emit_json([r.as_json() for r in results])
    else:
        for r in results:
            _loaded_table(r)
    if plot:
        _plot_loaded(plot, results)


def _loaded_table(r: Any) -> None:
    gpu_load = r.load_from.startswith("gpu")
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


def _plot_loaded(path: str, results: Sequence[Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    for r in results:
        xs = [p.achieved_bytes_per_s / 1e9 for p in r.points]
        ax.plot(xs, [p.latency_ns_p50 for p in r.points], marker="o", label=r.mix)
    ax.set_xlabel("load bandwidth reached (GB/s)")
    ax.set_ylabel("chase latency (ns, median of windows)")
    first = results[0]
    ax.set_title(f"loaded latency: {first.target} from {first.initiator}, "
                 f"load on {first.load_target} from {first.load_from}")  # fmt: skip
    ax.legend(title="mix")
    _save(fig, path)


@bench_group.command("first-touch")
@TARGET
@FROM
@click.option("--size", type=PAGE_SIZE, default=None, help="Buffer size (default: 64M).")
@PAGE
@AS_JSON
def first_touch_command(target: str, initiator: str | None, size: int, page: str,
                        as_json: bool) -> None:  # fmt: skip
    """Per-page first-write latency and throughput."""
    from pycxl.bench import dispatch

    _emit(dispatch.measure_first_touch(target, initiator, size=size, page=page), as_json)


@bench_group.command("transfer")
@click.option("--gpu", "-g", required=True, metavar="GPU",
              help="gpu0, gpu1..., or all (every GPU at once).")  # fmt: skip
@click.option("--target", "-t", required=True, metavar="TARGET",
              help="Host memory: dram0, cxl0, node1.")  # fmt: skip
@click.option("--direction", type=click.Choice(["h2d", "d2h", "both", "bidir"]), default="both",
              show_default=True, help="both: one after the other; bidir: at once.")  # fmt: skip
@click.option("--pageable", is_flag=True, help="Unpinned memory, the driver's own copy.")
@click.option("--staged", is_flag=True, help="Unpinned memory, pycxl's pipelined copy.")
@click.option("--size", type=PAGE_SIZE, default=None, help="Bytes per copy (default: 1G).")
@samples_option(None, "Timed copies after two untimed ones (default: 20).")
@AS_JSON
def transfer_command(gpu: str, target: str, direction: str, pageable: bool, staged: bool,
                     size: int | None, samples: int | None, as_json: bool) -> None:  # fmt: skip
    """Copy bandwidth between GPUs and host memory on a tier."""
    from pycxl.bench import dispatch

    if pageable and staged:
        raise click.UsageError("--pageable and --staged: choose one (both copy unpinned memory)")
    memory = "staged" if staged else "pageable" if pageable else "pinned"
    results = dispatch.measure_transfer(gpu, target, direction=direction, size=size,
                                        memory=memory, samples=samples)  # fmt: skip
    _emit(results, as_json)


@bench_group.command("offload")
@click.option("--target", "-t", default="all", show_default=True, metavar="TARGETS",
              help="Host tiers the weights live on: dram0, cxl0, or all.")  # fmt: skip
@click.option("--gpu", "-g", default="gpu0", show_default=True, metavar="GPU")
@click.option("--layers", type=COUNT, default=None, help="Layers in the stack (default: 16).")
@click.option("--width", type=CountType(minimum=8), default=None,
              help="Each layer is Linear(WIDTH, WIDTH) in bf16 (default: 8192).")  # fmt: skip
@click.option("--tokens", type=COUNT, default=None,
              help="Rows of activations: the compute per layer (default: 1024).")  # fmt: skip
@click.option("--lookahead", type=CountType(minimum=0), default=1, show_default=True,
              help="Layers pycxl copies ahead of the one computing.")  # fmt: skip
@click.option("--backward", is_flag=True, help="Forward and backward (gradients to the tier).")
@click.option("--mode", "modes", default=None, metavar="MODES",
              help="hbm (always run), pycxl, to, pinned, update (with --backward: the "
                   "optimizer step, its state on the tier). Default: all of them.")  # fmt: skip
@samples_option(None, "Timed steps after two untimed ones (default: 5).")
@AS_JSON
def offload_command(target: str, gpu: str, layers: int | None, width: int | None,
                    tokens: int | None, lookahead: int, backward: bool, modes: str | None,
                    samples: int | None, as_json: bool) -> None:  # fmt: skip
    """Layers run on a GPU with their weights on host tiers: streamed by pycxl, against
    plain .to() copies, pinned copies without look-ahead, and all in HBM; with
    --backward, the optimizer step with its state on the tier against its bound."""
    from pycxl.bench import dispatch

    results = dispatch.measure_offload(
        target, gpu, modes=modes, layers=layers, width=width, tokens=tokens,
        lookahead=lookahead, backward=backward, samples=samples,
    )  # fmt: skip
    if as_json:
        emit_json([r.as_json() for r in results])
        return
    _emit_offload(results)


def _emit_offload(results: Sequence[Any]) -> None:
    from pycxl.units import format_size

    first = results[0]
    pass_ = "forward+backward" if first.backward else "forward"
    click.echo(f"{first.layers} x Linear({first.width}, {first.width}) bf16 "
               f"({format_size(first.layer_bytes)} per layer), {first.tokens} tokens, "
               f"{pass_}, on {first.gpu}")  # fmt: skip
    together = any(r.alone_s is not None for r in results)
    rows = []
    for r in results:
        bound = "-"
        if r.mode == "update":
            bound = (f"{1e3 * r.bound_s:.1f} ms (CPU {_blocks(r.update_cpu_blocks)} at "
                     f"{r.update_cpu_rate / 1e9:.2f}, GPU {_blocks(r.update_gpu_blocks)} at "
                     f"{r.update_gpu_rate / 1e9:.2f} G parameters/s)")  # fmt: skip
        elif r.mode != "hbm":
            bound = (f"{1e3 * r.bound_s:.1f} ms (compute {1e3 * r.compute_s:.1f} ms, pinned "
                     f"{r.pinned_h2d_bytes_per_s / 1e9:.1f} GB/s)")  # fmt: skip
        row = [
            r.mode, r.initiator, r.target, "-" if r.node is None else r.node,
            f"{1e3 * r.step_s:.2f} ms", f"{r.vs_bound:.2f}x",
            "-" if r.hidden is None else f"{100 * r.hidden:.0f}%",
            "-" if r.link_bytes_per_s is None else _rate(r.link_bytes_per_s),
            "-" if r.pages is None else f"{r.pages_on_node}/{r.pages}", bound,
        ]  # fmt: skip
        if together:
            row[2:2] = [r.at_once, "-" if r.alone_s is None else f"{r.step_s / r.alone_s:.2f}x"]
        rows.append(row)
    head = ["mode", "gpu", "weights on", "node", "step", "vs bound", "copy hidden", "link",
            "pages on node", "bound"]  # fmt: skip
    if together:
        head[2:2] = ["at once", "vs alone"]
    emit_table(None, head, rows)


def _blocks(layers: Sequence[int]) -> str:
    from pycxl.values import format_ranges

    return f"layers {format_ranges(list(layers))}" if layers else "no layer"


@bench_group.command("matrix")
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
    from pycxl.bench import dispatch

    if not (latency or bandwidth or loaded):
        raise click.UsageError("--no-latency and --no-bandwidth leave nothing to measure")
    m = dispatch.measure_matrix(
        latency=latency, bandwidth=bandwidth, loaded=loaded, size=size,
        gpus=gpus, progress=_bar(as_json, "matrix"),
    )  # fmt: skip
    if as_json:
        emit_json([c.as_json() for c in m.cells])
        return
    titles = {"latency": "latency", "bandwidth": "bandwidth",
              "loaded": "latency at 50% / 90% of peak read bandwidth"}  # fmt: skip
    for kind in ("latency", "bandwidth", "loaded"):
        if not any(c.kind == kind for c in m.cells):
            continue
        rows = [[i] + [_cell(m, i, t, kind) for t in m.targets] for i in m.initiators]
        emit_table(f"{titles[kind]} (initiator x target)", ["", *m.targets], rows)
        if kind != "loaded":
            _say_cached([c.result for c in m.cells if c.kind == kind])


def _cell(m: Any, i: str, t: str, kind: str) -> str:
    c = m.cell(i, t, kind)
    if c is None:
        return "-"
    r = c.result
    cached = "*" if _in_cache(r) else ""  # as the other tables mark a size that fits
    if kind == "latency":
        return _ns(r.latency_ns) + cached
    if kind == "bandwidth":
        return _rate(r.bytes_per_s) + cached
    paced = sorted((p for p in r.points if p.target_bytes_per_s is not None),
                   key=lambda p: p.target_bytes_per_s)  # fmt: skip
    marks = [f"{p.latency_ns_p50:.0f}" + ("" if p.reached else "*") for p in paced]
    return " / ".join(marks) + " ns"  # *: the load fell short of that fraction


def _ns(v: float) -> str:
    return f"{v:.1f} ns"


def _rate(v: float) -> str:
    return f"{v / 1e9:.2f} GB/s"


def _bar(quiet: bool, label: str) -> Callable[[Sequence[T]], Iterable[T]]:
    """What a sweep iterates its points through: a progress bar on stderr, unless quiet
    or only one point."""

    def bar(items: Sequence[T]) -> Iterable[T]:
        return items if quiet or len(items) < 2 else _BarIter(items, label)

    return bar


class _BarIter:
    def __init__(self, items: Sequence[Any], label: str) -> None:
        self.items, self.label = items, label

    def __iter__(self) -> Any:
        if sys.stderr is None:  # closed: no bar, and never one drawn on stdout instead
            yield from self.items
            return
        with click.progressbar(self.items, label=self.label, file=sys.stderr) as bar:
            yield from bar


# --- tables ----------------------------------------------------------------------------
FIGURES = {
    "latency": ("latency_ns", "latency_ns_median"),
    "bandwidth": ("bytes_per_s", "bytes_per_s_median"),
    "first-touch": ("p50_ns", "p90_ns", "p99_ns", "max_ns", "bytes_per_s"),
    "transfer": ("bytes_per_s", "bytes_per_s_median"),
}


def _emit(results: Sequence[BenchResult], as_json: bool) -> None:
    from pycxl.units import format_size

    if as_json:
        emit_json([r.as_json() for r in results])
        return
    for bench in dict.fromkeys(r.benchmark for r in results):
        keys = FIGURES[bench]
        mine = [r for r in results if r.benchmark == bench]
        adv = ADVERTISED.get(bench)
        rows: list[list[Any]] = [
            [r.benchmark, _variant(r), r.target, r.node, r.initiator, len(r.cpus) or "-",
             format_size(r.size) + ("*" if _in_cache(r) else ""),
             format_size(r.page_size) if r.page_size else "-",
             *(_figure(k, getattr(r, k)) for k in keys),
             *(_advertised_cells(r, adv) if adv else [])]
            for r in mine
        ]  # fmt: skip
        emit_table(None, ["bench", "kernel", "target", "node", "from", "cpus", "size", "page",
                          *keys, *(["advertised", "apart"] if adv else [])], rows)  # fmt: skip
        if adv:
            _say_apart(mine, adv)
    _say_lanes(results)
    _say_cached(results)


def _say_cached(results: Sequence[BenchResult]) -> None:
    """The footnote of a '*': a figure of the cache, not of the tier."""
    from pycxl.units import format_size

    cached = [r for r in results if _in_cache(r)]
    if cached:
        r = cached[0]
        cache = format_size(getattr(r, "last_level_cache", 0))
        click.echo(f"* fits in the {cache} last-level cache: the figure is the cache's, not "
                   f"{r.target}'s memory (the default size is 4x the cache)\n")  # fmt: skip


def _say_lanes(results: Sequence[BenchResult]) -> None:
    """Copies that ran at once: each one's bandwidth beside its own alone."""
    for r in results:
        for lane in getattr(r, "lanes", ()):
            if lane.alone_bytes_per_s is None:
                continue
            click.echo(f"  {lane.gpu} {lane.direction}: {_figure('bytes_per_s', lane.bytes_per_s)}"
                       f" at once, {_figure('bytes_per_s', lane.alone_bytes_per_s)} alone "
                       f"({lane.bytes_per_s / lane.alone_bytes_per_s:.2f}x)")  # fmt: skip


def _in_cache(r: BenchResult) -> bool:
    return bool(getattr(r, "fits_in_cache", False))


# the advertised figure beside each measurement, and the measured one it is set against
ADVERTISED = {
    "latency": ("advertised_latency_ns", "latency_ns_median"),
    "bandwidth": ("advertised_bytes_per_s", "bytes_per_s"),
}


def _advertised_cells(r: BenchResult, adv: tuple[str, str]) -> list[str]:
    value = getattr(r, adv[0], None)
    if value is None:
        return ["not advertised", "-"]
    apart = getattr(r, "advertised_factor", None)
    return [_figure(adv[1], value), "-" if apart is None else f"{apart:.1f}x"]


def _say_apart(results: Sequence[BenchResult], adv: tuple[str, str]) -> None:
    """A line for each figure further from the advertised one than the stated factor."""
    from pycxl.measure.results import ADVERTISED_FACTOR

    for r in results:
        apart = getattr(r, "advertised_factor", None)
        if apart is not None and apart > ADVERTISED_FACTOR:
            click.echo(
                f"{r.target} from {r.initiator}: measured {_figure(adv[1], getattr(r, adv[1]))}, "
                f"advertised {_figure(adv[1], getattr(r, adv[0]))}: {apart:.1f}x apart, more "
                f"than {ADVERTISED_FACTOR:g}x (firmware figures can be wrong; so can a "
                "measurement of memory that is not where it should be)"
            )


def _variant(r: BenchResult) -> str:
    """The kernel of a bandwidth result; the direction and memory of a transfer."""
    from pycxl.measure.results import BandwidthResult, TransferResult

    if isinstance(r, BandwidthResult):
        return r.kernel
    if isinstance(r, TransferResult):
        return f"{r.direction} {r.memory}"
    return "-"


def _figure(key: str, v: float) -> str:
    if key.startswith("bytes_per_s"):
        return f"{v / 1e9:.2f} GB/s"
    return f"{v:.1f}"


def _plot(path: str, results: Sequence[Any], x: str, y: str, xl: str, yl: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r.size if x == "size" else len(r.cpus) for r in results]
    fig, ax = plt.subplots()
    ax.plot(xs, [getattr(r, y) for r in results], marker="o")
    if x == "size":
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    ax.set_title(f"{results[0].benchmark}: {results[0].target} from {results[0].initiator}")
    _save(fig, path)


def _save(fig: Any, path: str) -> None:
    """The figure in the format its name says, replacing the file atomically (never
    through a symbolic link)."""
    import io

    from pycxl.outfiles import write_atomically

    data = io.BytesIO()
    fig.savefig(data, format=path.rsplit(".", 1)[-1].lower())
    write_atomically(path, data.getvalue())
