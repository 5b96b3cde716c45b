"""Tables of bench results: one row per result, the figures of its kind, the
advertised figure beside it, and the footnotes (a size that fits in the cache, copies
that ran at once, a figure far from the advertised one).

What each kind of result shows is decided in one place (``shown``), by its type."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from ..render import emit_json, emit_table

if TYPE_CHECKING:
    from pycxl.measure.results import BenchResult, Lane

# the figures each benchmark's table shows (their column names: the JSON keys)
FIGURES = {
    "latency": ("latency_ns", "latency_ns_median"),
    "bandwidth": ("bytes_per_s", "bytes_per_s_median"),
    "first-touch": ("p50_ns", "p90_ns", "p99_ns", "max_ns", "bytes_per_s"),
    "transfer": ("bytes_per_s", "bytes_per_s_median"),
}
# the advertised figure's column, and the measured figure it is set against
ADVERTISED = {
    "latency": ("advertised_latency_ns", "latency_ns_median"),
    "bandwidth": ("advertised_bytes_per_s", "bytes_per_s"),
}


@dataclass(frozen=True)
class Shown:
    """What a result's row and footnotes show."""

    variant: str  # the kernel of a bandwidth result; the direction and memory of a transfer
    figures: tuple[float, ...]  # in the order of FIGURES[benchmark]
    # the advertised figure, how far apart, and the measured figure it is set against;
    # None for kinds with nothing advertised
    advertised: tuple[float | None, float | None, float] | None = None
    cache: int | None = None  # the last-level cache the working set fits in, if it does
    lanes: tuple[Lane, ...] = ()  # copies that ran at once


def shown(r: BenchResult) -> Shown:
    """The row of one result, by its type."""
    from pycxl.measure.results import (
        BandwidthResult,
        FirstTouchResult,
        LatencyResult,
        TransferResult,
    )

    if isinstance(r, LatencyResult):
        return Shown("-", (r.latency_ns, r.latency_ns_median),
                     (r.advertised_latency_ns, r.advertised_factor, r.latency_ns_median),
                     cache_fit(r))  # fmt: skip
    if isinstance(r, BandwidthResult):
        return Shown(r.kernel, (r.bytes_per_s, r.bytes_per_s_median),
                     (r.advertised_bytes_per_s, r.advertised_factor, r.bytes_per_s),
                     cache_fit(r))  # fmt: skip
    if isinstance(r, FirstTouchResult):
        return Shown("-", (r.p50_ns, r.p90_ns, r.p99_ns, r.max_ns, r.bytes_per_s))
    if isinstance(r, TransferResult):
        return Shown(f"{r.direction} {r.memory}", (r.bytes_per_s, r.bytes_per_s_median),
                     lanes=r.lanes)  # fmt: skip
    raise TypeError(f"no table for {type(r).__name__}")  # a new result needs its row here


def cache_fit(r: Any) -> int | None:
    """The cache a latency or bandwidth result's working set fits in (its figure is the
    cache's), else None."""
    from pycxl.measure.results import BandwidthResult, LatencyResult

    if isinstance(r, LatencyResult | BandwidthResult) and r.fits_in_cache:
        return r.last_level_cache or 0
    return None


def emit_results(results: Sequence[BenchResult], as_json: bool) -> None:
    """Results as JSON, or a table per benchmark and the footnotes."""
    from pycxl.base.units import format_size

    if as_json:
        from pycxl.measure.results import bench_result_json

        emit_json([bench_result_json(r) for r in results])
        return
    rows_of = [(r, shown(r)) for r in results]
    for bench in dict.fromkeys(r.benchmark for r in results):
        keys = FIGURES[bench]
        mine = [(r, s) for r, s in rows_of if r.benchmark == bench]
        adv = ADVERTISED.get(bench)
        rows: list[list[Any]] = [
            [r.benchmark, s.variant, r.target, r.node, r.initiator, len(r.cpus) or "-",
             format_size(r.size) + ("*" if s.cache is not None else ""),
             format_size(r.page_size) if r.page_size else "-",
             *(figure(k, v) for k, v in zip(keys, s.figures, strict=True)),
             *(_advertised_cells(s, adv) if adv else [])]
            for r, s in mine
        ]  # fmt: skip
        emit_table(None, ["bench", "kernel", "target", "node", "from", "cpus", "size", "page",
                          *keys, *(["advertised", "apart"] if adv else [])], rows)  # fmt: skip
        if adv:
            _say_apart(mine, adv)
    _say_lanes([s for _, s in rows_of])
    say_cached(results)


def say_cached(results: Sequence[Any]) -> None:
    """The footnote of a '*': a figure of the cache, not of the tier."""
    from pycxl.base.units import format_size

    cached = [(r, c) for r in results if (c := cache_fit(r)) is not None]
    if cached:
        r, cache = cached[0]
        click.echo(f"* fits in the {format_size(cache)} last-level cache: the figure is the "
                   f"cache's, not {r.target}'s memory (the default size is 4x the "
                   "cache)\n")  # fmt: skip


def _say_lanes(rows: Sequence[Shown]) -> None:
    """Copies that ran at once: each one's bandwidth beside its own alone."""
    for s in rows:
        for lane in s.lanes:
            if lane.alone_bytes_per_s is None:
                continue
            click.echo(f"  {lane.gpu} {lane.direction}: {figure('bytes_per_s', lane.bytes_per_s)}"
                       f" at once, {figure('bytes_per_s', lane.alone_bytes_per_s)} alone "
                       f"({lane.bytes_per_s / lane.alone_bytes_per_s:.2f}x)")  # fmt: skip


def _advertised_cells(s: Shown, adv: tuple[str, str]) -> list[str]:
    assert s.advertised is not None  # the kinds in ADVERTISED have one
    value, apart, _ = s.advertised
    if value is None:
        return ["not advertised", "-"]
    return [figure(adv[1], value), "-" if apart is None else f"{apart:.1f}x"]


def _say_apart(rows: Sequence[tuple[BenchResult, Shown]], adv: tuple[str, str]) -> None:
    """A line for each figure further from the advertised one than the stated factor."""
    from pycxl.measure.results import ADVERTISED_FACTOR

    for r, s in rows:
        assert s.advertised is not None
        value, apart, measured = s.advertised
        if value is not None and apart is not None and apart > ADVERTISED_FACTOR:
            click.echo(
                f"{r.target} from {r.initiator}: measured {figure(adv[1], measured)}, "
                f"advertised {figure(adv[1], value)}: {apart:.1f}x apart, more "
                f"than {ADVERTISED_FACTOR:g}x (firmware figures can be wrong; so can a "
                "measurement of memory that is not where it should be)"
            )


def figure(key: str, v: float) -> str:
    """A figure as its column shows it: rates in GB/s, times to a tenth."""
    if key.startswith("bytes_per_s"):
        return f"{v / 1e9:.2f} GB/s"
    return f"{v:.1f}"


def ns(v: float) -> str:
    return f"{v:.1f} ns"


def rate(v: float) -> str:
    return f"{v / 1e9:.2f} GB/s"
