"""Recorded sysfs trees, and copies of them edited only to make bad input, for the fleet
tests: a memory block offline, a memdev disabled or gone, a region not committed; and
the event log ``pycxl monitor`` writes, made from a recorded kernel trace line."""

from __future__ import annotations

import shutil
from pathlib import Path

from pycxl.base.trace import parse_line
from pycxl.ops.monitor import Locator, append_log, trace_record
from pycxl.resolve.system import snapshot

DATA = Path(__file__).resolve().parents[1] / "data"
REGION = DATA / "trees" / "two-dev" / "region"  # region0 online as cxl0 (512 MiB), normal zone
FRESH = DATA / "trees" / "two-dev" / "fresh"  # two memdevs, no region
TRACE = DATA / "trace" / "cxl-events.txt"

# edit -> (file under the tree, what to do): each breaks one thing the check looks at
EDITS = ("blocks-offline", "memdev-disabled", "memdev-gone", "region-uncommitted")


def edited_tree(dest: Path, edit: str) -> Path:
    """A copy of the recorded region tree at ``dest`` with one thing broken."""
    shutil.copytree(REGION, dest, symlinks=True)
    if edit == "blocks-offline":  # the last of region0's four memory blocks
        (dest / "sys/devices/system/memory/memory37/state").write_text("offline\n")
    elif edit == "memdev-disabled":  # mem1's driver unbound
        (dest / "sys/bus/cxl/devices/mem1/driver").unlink()
    elif edit == "memdev-gone":  # mem1 (serial 0x2) no longer on the bus
        (dest / "sys/bus/cxl/devices/mem1").unlink()
    elif edit == "region-uncommitted":
        (dest / "sys/bus/cxl/devices/region0/commit").write_text("0\n")
    else:
        raise ValueError(f"unknown edit {edit!r}: one of {', '.join(EDITS)}")
    return dest


def health_event_log(path: Path, sysroot: Path = REGION) -> Path:
    """The monitor's log of the recorded memory-module event (a device reporting
    REPLACEMENT_NEEDED; serial 2, mem1 in the region tree), as the monitor writes it."""
    (event,) = [e for e in map(parse_line, TRACE.read_text().splitlines())
                if e is not None and e.name == "cxl_memory_module"]  # fmt: skip
    system = snapshot(sysroot=str(sysroot), gpus=False)
    append_log(str(path), trace_record(event, Locator(system)))
    return path
