"""A memdev's poison list (media errors), as the kernel gives it: writing the memdev's
``trigger_poison_list`` makes the kernel send Get Poison List to the device and emit
one ``cxl_poison`` trace event per record, with the region and host physical address
when the range is mapped by a region. pycxl reads those events from a private trace
instance (``pycxl.trace``), as ndctl's ``cxl list --media-errors`` does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import NeedsRootError, SysfsError
from ..sysfs import Sysfs
from ..trace import TraceEvent, TraceInstance
from .mailbox import Unsupported

POISON_EVENT = "cxl/cxl_poison"
BUS = "/sys/bus/cxl/devices"
NO_HPA = (1 << 64) - 1  # the kernel's "not mapped" host physical address


@dataclass(frozen=True)
class PoisonRecord:
    """One poisoned range of a memdev: device address, length, where the device says it
    came from, and the region and host address it is mapped at (None when unmapped)."""

    memdev: str
    dpa: int
    length: int
    source: str
    region: str | None = None
    hpa: int | None = None

    def as_json(self) -> dict[str, object]:
        """ndctl's media-error fields (offset and length of the device range), plus the
        region and host address."""
        return {
            "offset": self.dpa,
            "length": self.length,
            "source": self.source,
            "region": self.region,
            "hpa": self.hpa,
        }


def record_from_event(event: TraceEvent) -> PoisonRecord | None:
    """A ``cxl_poison`` event of a poison-list read as a record (None for other events)."""
    f = event.fields
    if event.name != "cxl_poison" or f.get("trace_type", "List") != "List":
        return None
    hpa = _hex(f.get("hpa"))
    return PoisonRecord(
        memdev=f.get("memdev", "?"),
        dpa=_hex(f.get("dpa")) or 0,
        length=_hex(f.get("dpa_length")) or 0,
        source=f.get("source", "Unknown"),
        region=f.get("region") or None,
        hpa=None if hpa in (None, NO_HPA) else hpa,
    )


def _hex(value: str | None) -> int | None:
    if not value:
        return None
    try:
        return int(value, 16)
    except ValueError:
        return None


def read_poison(
    memdevs: Iterable[str], fs: Sysfs | None = None
) -> dict[str, list[PoisonRecord] | Unsupported]:
    """Each memdev's poison list; ``Unsupported`` for a memdev whose device or kernel
    has no poison list. Needs root (the trigger and the trace events)."""
    fs = fs or Sysfs()
    names = list(memdevs)
    out: dict[str, list[PoisonRecord] | Unsupported] = {}
    listable = []
    for name in names:
        if fs.exists(f"{BUS}/{name}/trigger_poison_list"):
            listable.append(name)
        else:
            out[name] = Unsupported("Get Poison List", "the kernel offers no poison list here")
    if not listable:
        return out
    if os.geteuid() != 0:
        raise NeedsRootError("reading the poison list needs root (it triggers the device)")
    with TraceInstance([POISON_EVENT], fs) as trace:
        if trace.missing:
            for name in listable:
                out[name] = Unsupported("Get Poison List", "the kernel has no cxl_poison event")
            return out
        lists: dict[str, list[PoisonRecord]] = {}
        for name in listable:
            try:
                fs.write(f"{BUS}/{name}/trigger_poison_list", "1")
                lists[name] = []
            except SysfsError as e:  # this device refused; the others go on
                out[name] = Unsupported("Get Poison List", f"refused by the kernel ({e})")
        for event in trace.drain():
            rec = record_from_event(event)
            if rec is not None and rec.memdev in lists:
                lists[rec.memdev].append(rec)
    return out | lists
