"""The event log ``pycxl monitor --log`` writes, read back for ``pycxl check``."""

from __future__ import annotations

from typing import Any

from ..base.errors import InvalidRequestError
from ..base.values import read_text

DEFAULT_EVENT_LOG = "/var/log/pycxl/events.jsonl"


def read_event_log(path: str) -> list[dict[str, Any]]:
    """The records of the event log ``pycxl monitor --log`` writes, one JSON object per
    line. A last line cut short (a crash while writing) is skipped; any other line that
    is not a JSON object is an InvalidRequestError naming the file and the line."""
    import json  # only where there is a log: check runs at the top of job scripts

    text = read_text(path, "event log")
    lines = text.split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        record: Any = None
        try:
            record = json.loads(line)
        except ValueError:
            if i == last and not text.endswith("\n"):
                continue  # cut short
        if not isinstance(record, dict):
            raise InvalidRequestError(
                f"event log {path}: line {i + 1} is not a JSON object ({line[:40]!r}); "
                "give the file pycxl monitor --log writes"
            )
        records.append(record)
    return records
