"""A memdev's poison list (media errors), as the kernel gives it: writing the memdev's
``trigger_poison_list`` makes the kernel send Get Poison List to the device and emit
one ``cxl_poison`` trace event per record, with the region and host physical address
when the range is mapped by a region. pycxl reads those events from a private trace
instance (``pycxl.base.trace``), as ndctl's ``cxl list --media-errors`` does.

Poison is injected and cleared through the kernel's debugfs files
(``/sys/kernel/debug/cxl/memX/{inject,clear}_poison``), as ndctl's
``inject-media-poison`` and ``clear-media-poison`` do.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..base.errors import InvalidRequestError, NeedsRootError, NotAvailableError, SysfsError
from ..base.sysfs import Sysfs
from ..base.trace import TraceEvent, TraceInstance
from .mailbox import Unsupported

if TYPE_CHECKING:
    from . import device_ops
    from .device_ops import DeviceResult
    from .model import Memdev

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


# --- injection (ndctl's inject-media-poison / clear-media-poison) ---------------------
DEBUGFS = "/sys/kernel/debug"
POISON_ALIGN = 64  # the kernel injects and clears whole 64-byte lines


def debugfs_dir(fs: Sysfs, memdev: str) -> str:
    """The memdev's debugfs folder (``inject_poison``, ``clear_poison``), or an error that
    says what is missing: debugfs itself, or the kernel's injection support."""
    path = f"{DEBUGFS}/cxl/{memdev}"
    if fs.exists(f"{path}/inject_poison"):
        return path
    if not fs.exists(f"{DEBUGFS}/cxl"):
        raise NotAvailableError(
            f"{DEBUGFS}/cxl is absent: mount debugfs (mount -t debugfs none {DEBUGFS}) and "
            "load the CXL drivers; poison is injected through it"
        )
    raise NotAvailableError(
        f"{memdev} has no {path}/inject_poison: its device has no Inject Poison command, or "
        "the kernel lacks CONFIG_CXL_POISON_INJECT"
    )


def check_poison_address(memdev: Memdev, dpa: int) -> int:
    """A device physical address that can be poisoned: inside the device and on a
    64-byte line (the kernel refuses anything else with EINVAL, unexplained)."""
    total = memdev.ram_size + memdev.pmem_size
    if isinstance(dpa, bool) or not isinstance(dpa, int) or dpa < 0:
        raise InvalidRequestError(f"address {dpa!r}: give a device physical address such as "
                                  "0x1000")  # fmt: skip
    if dpa >= total:
        raise InvalidRequestError(f"address {dpa:#x} is beyond {memdev.name}'s capacity "
                                  f"({total:#x} bytes); give one below it")  # fmt: skip
    if dpa % POISON_ALIGN:
        raise InvalidRequestError(f"address {dpa:#x} is not 64-byte aligned: poison covers "
                                  f"whole lines; try {dpa - dpa % POISON_ALIGN:#x}")  # fmt: skip
    return dpa


def inject_poison(
    memdev: str,
    address: int,
    *,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Poison the 64-byte line at device address ``address`` of ``memdev`` (a test of
    the alerting path: the poison list, ``pycxl check`` and the monitor then show it)."""
    return _poison(memdev, address, system, dry_run, inject=True)


def clear_poison(
    memdev: str,
    address: int,
    *,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Clear the poison at device address ``address`` of ``memdev`` (the line is written
    with zeros)."""
    return _poison(memdev, address, system, dry_run, inject=False)


def _poison(memdev: str, address: int, system: device_ops.Host | None,
            dry_run: bool, inject: bool) -> DeviceResult:  # fmt: skip
    from ..base.plan import Plan, write
    from . import device_ops

    memdev, dry_run = device_ops.name(memdev, "memdev"), device_ops.flag(dry_run, "dry_run")
    fs = device_ops.host(system)
    m = device_ops.topology(fs).find_memdev(memdev)
    dpa = check_poison_address(m, address)
    path = debugfs_dir(fs, m.name)
    do, undo = ("inject_poison", "clear_poison") if inject else ("clear_poison", "inject_poison")
    verb = "poison" if inject else "clear the poison of"
    step = write(f"{verb} {m.name}'s line at DPA {dpa:#x}", f"{path}/{do}", f"{dpa:#x}",
                 (f"{path}/{undo}", f"{dpa:#x}"))  # fmt: skip
    plan = Plan(f"{'inject' if inject else 'clear'}-media-poison {m.name}", (step,))
    done = device_ops.run(fs, m.name, plan, dry_run=dry_run, what="poison injection")
    region = next((r.name for r in m.regions), None)
    return device_ops.DeviceResult(m.name, plan, done, memdev=m,
                                   details={"address": dpa, "region": region})  # fmt: skip
