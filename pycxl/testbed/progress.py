"""What a guest command has finished, kept in the shared work directory, so that a boot cut
short (the emulator stopped, or the guest made no progress for too long) is followed by
one that resumes instead of starting over, and the host can tell a slow guest that still
finishes work from a stuck one.

A command that can resume appends one JSON line to REPORT per unit of work: when it starts
a unit (``{"nodeid": ..., "when": "start", "boot": N}``) and when the unit ends
(``{"nodeid": ..., "when": "call", "outcome": "passed", ...}``; pytest's phases). The
host appends to STOPS why each boot it cut short ended. A unit started in a boot that was
cut short, and never finished, is the one that was running when the boot stopped.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

REPORT = "guest-report.jsonl"  # the guest command's units: started, finished
STOPS = "stopped-boots.jsonl"  # the host's: {"boot": N, "reason": "..."} per boot cut short
START = "start"
# Limits in seconds of the emulator's CPU time (a starved guest is not a stuck one), with
# the wall clock as a backstop at three times as much (clock.py)
BOOT_TIMEOUT_S = 600.0  # for a boot to reach the command (kernel, drivers, memdevs probed)
# without progress (new output, a unit started or finished) once the command runs: more
# than any one kernel test uses
STALL_TIMEOUT_S = 900.0


def _read(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a file; a line cut short by a stopped guest is not one."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _append(path: Path, rec: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(rec) + "\n")


def records(workdir: Path) -> list[dict[str, Any]]:
    """Every record the guest command wrote, in order, in every boot."""
    return [r for r in _read(workdir / REPORT) if isinstance(r.get("nodeid"), str)]


def outcomes(workdir: Path) -> list[dict[str, Any]]:
    """The records of units that ended (any phase), without the start records."""
    return [r for r in records(workdir) if r.get("when") != START]


def finished(workdir: Path) -> set[str]:
    """The units that ended, in any boot."""
    return {r["nodeid"] for r in outcomes(workdir)}


def record(workdir: Path, rec: dict[str, Any]) -> None:
    """Guest side: append one record."""
    _append(workdir / REPORT, rec)


def record_start(workdir: Path, nodeid: str) -> None:
    """Guest side: a unit starts in this boot."""
    record(workdir, {"nodeid": nodeid, "when": START, "boot": current_boot(workdir)})


def stops(workdir: Path) -> list[dict[str, Any]]:
    """Why each earlier boot was cut short, oldest first."""
    return _read(workdir / STOPS)


def note_stop(workdir: Path, boot: int, reason: str) -> None:
    """Host side: boot ``boot`` was cut short, for ``reason`` (words)."""
    _append(workdir / STOPS, {"boot": boot, "reason": reason})


def current_boot(workdir: Path) -> int:
    """The number of the boot running now (the first is 1)."""
    return len(stops(workdir)) + 1


def stopped_in(workdir: Path) -> dict[str, list[int]]:
    """Each unit that never ended -> the boots that stopped while it ran."""
    done = finished(workdir)
    out: dict[str, list[int]] = defaultdict(list)
    for r in records(workdir):
        if r.get("when") == START and r["nodeid"] not in done and isinstance(r.get("boot"), int):
            out[r["nodeid"]].append(r["boot"])
    return dict(out)


def stop_reasons(workdir: Path, boots: list[int]) -> str:
    """'boot 1: ..., boot 2: ...' for these boots, from the host's notes."""
    said = {s.get("boot"): s.get("reason", "?") for s in stops(workdir)}
    return "; ".join(f"boot {b}: {said.get(b, 'stopped')}" for b in boots)
