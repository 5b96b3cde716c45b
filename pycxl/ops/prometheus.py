"""The Prometheus text exposition format, written the way node_exporter's textfile
collector wants it: one ``*.prom`` file, replaced atomically (written beside it, then
renamed), metric names with the ``pycxl_`` prefix.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..errors import InvalidRequestError, OperationError

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
    if not path.endswith(".prom"):
        raise InvalidRequestError(
            f"textfile {path}: node_exporter's textfile collector reads only *.prom files"
        )
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InvalidRequestError(f"textfile {path}: directory {directory} does not exist")
    if os.path.isdir(path):
        raise InvalidRequestError(f"textfile {path} is a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidRequestError(
            f"textfile {path}: directory {directory} is not writable by this user"
        )


def write_textfile(path: str, metrics: Iterable[Metric]) -> None:
    """Replace ``path`` with ``metrics`` atomically: a scrape sees the old file or the
    new one, never half of one."""
    check_textfile_path(path)
    text = render(metrics)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".pycxl-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise OperationError(f"cannot write textfile {path}: {e.strerror}") from e
