"""The Prometheus text exposition format, written the way node_exporter's textfile
collector wants it: one ``*.prom`` file, replaced atomically (written beside it, then
renamed), metric names with the ``pycxl_`` prefix.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..base.outfiles import check_output_path, write_atomically

PREFIX = "pycxl_"
Labels = Mapping[str, str | int | None]


@dataclass
class Metric:
    """One metric family: name (without the prefix), help text, type, and samples."""

    name: str
    help: str
    type: Literal["gauge", "counter"] = "gauge"
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float | int | bool | None, **labels: str | int | None) -> None:
        """A sample; labels whose value is None are left out; a None value is skipped."""
        if value is None:
            return
        self.samples.append(({k: str(v) for k, v in labels.items() if v is not None}, float(value)))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def render(metrics: Iterable[Metric]) -> str:
    """The exposition text of ``metrics`` (families without samples are left out)."""
    lines = []
    for m in metrics:
        if not m.samples:
            continue
        name = PREFIX + m.name
        lines.append(f"# HELP {name} {_escape(m.help)}")
        lines.append(f"# TYPE {name} {m.type}")
        for labels, value in m.samples:
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            lines.append(
                f"{name}{{{body}}} {_number(value)}" if body else f"{name} {_number(value)}"
            )
    return "\n".join(lines) + "\n"


def check_textfile_path(path: str) -> None:
    """Refuse, before anything runs, a path node_exporter would not read or pycxl
    could not write."""
    check_output_path(path, "textfile", suffixes=(".prom",))


def write_textfile(path: str, metrics: Iterable[Metric]) -> None:
    """Replace ``path`` with ``metrics`` atomically: a scrape sees the old file or the
    new one, never half of one."""
    check_textfile_path(path)
    write_atomically(path, render(metrics))
