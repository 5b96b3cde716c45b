"""Drawings of bench results (matplotlib, imported only when --plot is given)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pycxl.measure.results import (
        BandwidthResult,
        LatencyResult,
        LoadedLatencyResult,
        TransferResult,
    )


def plot_latency(path: str, results: Sequence[LatencyResult]) -> None:
    """Latency per working set, on a log scale."""
    _plot(path, results, [r.size for r in results], [r.latency_ns for r in results],
          "working set (bytes)", "ns per load", log_x=True)  # fmt: skip


def plot_bandwidth(path: str, results: Sequence[BandwidthResult | TransferResult]) -> None:
    """Bandwidth per thread count."""
    _plot(path, results, [len(r.cpus) for r in results], [r.bytes_per_s for r in results],
          "threads", "bytes/s", log_x=False)  # fmt: skip


def _plot(path: str, results: Sequence[Any], xs: list[int], ys: list[float], xl: str, yl: str,
          *, log_x: bool) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot(xs, ys, marker="o")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xl)
    ax.set_ylabel(yl)
    ax.set_title(f"{results[0].benchmark}: {results[0].target} from {results[0].initiator}")
    save(fig, path)


def plot_loaded(path: str, results: Sequence[LoadedLatencyResult]) -> None:
    """Chase latency against the load bandwidth reached, one curve per mix."""
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
    save(fig, path)


def save(fig: Any, path: str) -> None:
    """The figure in the format its name says, replacing the file atomically (never
    through a symbolic link)."""
    import io

    from pycxl.base.outfiles import write_atomically

    data = io.BytesIO()
    fig.savefig(data, format=path.rsplit(".", 1)[-1].lower())
    write_atomically(path, data.getvalue())
