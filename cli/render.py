"""Tables for people, JSON for programs.

Tables are drawn here in tabulate's "simple" format (a test holds the two equal): the
tabulate package takes about as long to import as the rest of ``pycxl list`` runs.
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from pycxl.base.values import format_ranges

if TYPE_CHECKING:
    from pycxl.numa.access import AccessFigures
    from pycxl.resolve.system import System
    from pycxl.resolve.tiers import NodeTier

MIN_PADDING = 2  # tabulate's: a header is at least this much narrower than its column


def emit_json(doc: Any) -> None:
    import json  # here: tables, the usual output, need none of it

    click.echo(json.dumps(doc, indent=2))


def emit_json_line(doc: Any) -> None:
    """One compact JSON object per line, flushed: for streams (monitor, stat)."""
    import json

    click.echo(json.dumps(doc, sort_keys=True))
    sys.stdout.flush()


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns two spaces apart, a dashed line under the headers."""
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    widths = [
        max([_width(h) + MIN_PADDING, *(_width(r[i]) for r in cells if i < len(r))])
        for i, h in enumerate(headers)
    ]
    lines = [_line(headers, widths), "  ".join("-" * w for w in widths)]
    lines += [_line(r, widths) for r in cells]
    return "\n".join(lines)


def _line(values: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(
        v + " " * (w - _width(v)) for v, w in zip(values, widths, strict=False)
    ).rstrip()


def _width(text: str) -> int:
    if text.isascii():
        return len(text)
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def emit_table(title: str | None, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    if title:
        click.echo(click.style(title, bold=True))
    if rows:
        click.echo(table(headers, rows))
    else:
        click.echo("  (none)")
    click.echo()


def dash(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def pins(holds: bool | None, zone: str | None) -> str:
    """What long-term pins (GPU registration) do to a node's pages: stay, move, partly."""
    if holds is None:
        return "partly" if zone == "mixed" else "-"
    return "stay" if holds else "move"


def ranges(ids: Sequence[int]) -> str:
    """'0-3,8' for (0, 1, 2, 3, 8); '-' for none."""
    return format_ranges(ids) if ids else "-"


NOT_ADVERTISED = "not advertised"


def advertised(f: AccessFigures | None) -> str:
    """What the platform advertises for CPUs, read figures: '212 ns 15.62 GiB/s'."""
    from pycxl.base.units import format_size

    if f is None:
        return NOT_ADVERTISED
    lat = f"{f.read_latency_ns} ns" if f.read_latency_ns is not None else "? ns"
    bw = f"{format_size(f.read_bytes_per_s)}/s" if f.read_bytes_per_s is not None else "? B/s"
    return f"{lat} {bw}"


def near(system: System, nt: NodeTier) -> str:
    """A node's nearest node with CPUs, by tier name ('-' for a node with CPUs)."""
    if nt.near is None or nt.near == nt.node.id:
        return "-"
    return system.tier_name(nt.near) or f"node{nt.near}"


def sockets(system: System, nodes: Sequence[int]) -> str:
    """The CPU nodes memdevs hang off, by tier name: 'dram0', 'dram0+dram1'."""
    return "+".join(system.tier_name(n) or f"node{n}" for n in nodes) or "-"
