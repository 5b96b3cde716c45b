"""``pycxl monitor``: the kernel's CXL events and CXL/dax/memory hotplug as one stream
of dicts (JSON lines in the CLI), each located on the host: memdev, serial, region, NUMA
node and tier name, host physical address.

Trace events come from a private tracefs instance (``pycxl.base.trace``), so the global
trace buffer and whatever else traces are untouched and everything pycxl enabled is
gone when the stream stops. Hotplug comes from the kernel's uevent netlink socket
(pyudev), which needs no udev daemon.
"""

from __future__ import annotations

import datetime
import json
import select
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

from ..base.errors import InvalidRequestError, NotAvailableError
from ..base.outfiles import append_line
from ..base.trace import TraceEvent, TraceInstance
from ..base.values import SYSROOT_ENV, count as whole_count, finite
from ..resolve.system import System, given_or_read, snapshot

TRACE_EVENTS = (
    "cxl/cxl_general_media",
    "cxl/cxl_dram",
    "cxl/cxl_memory_module",
    "cxl/cxl_poison",
    "cxl/cxl_aer_correctable_error",
    "cxl/cxl_aer_uncorrectable_error",
    "cxl/cxl_generic_event",
    "cxl/cxl_overflow",
)
UEVENT_SUBSYSTEMS = ("cxl", "dax", "memory")
MEMORY_DIR = "/sys/devices/system/memory"
NO_ADDRESS = (1 << 64) - 1  # the kernel's "no host physical address"
POLL_S = 0.5


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def _address(value: str | None) -> int | None:
    if not value:
        return None
    try:
        n = int(value, 16)
    except ValueError:
        return None
    return None if n == NO_ADDRESS else n


class Locator:
    """Locates events on the host: HPA or region -> region, node, tier name. Re-reads
    the topology after hotplug, so regions made while monitoring are known."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.fs = system.sysfs()  # the tree, opened once

    def refresh(self) -> None:
        """Read the topology again (after a hotplug event)."""
        self.system = snapshot(self.fs, gpus=False)

    def locate(self, out: dict[str, Any], region: str | None, hpa: int | None) -> None:
        """Fill region, node and target of ``out`` from a region name or an address."""
        regions = self.system.cxl.regions
        r = next((x for x in regions if x.name == region), None) if region else None
        if r is None and hpa is not None:
            r = next(
                (
                    x
                    for x in regions
                    if x.resource is not None and x.resource <= hpa < x.resource + x.size
                ),
                None,
            )
        out["region"] = r.name if r is not None else region
        node = r.numa_nodes[0] if r is not None and r.numa_nodes else out.get("node")
        out["node"] = node
        out["target"] = self.system.tier_name(node) if node is not None else None


def trace_record(event: TraceEvent, locator: Locator) -> dict[str, Any]:
    """One trace event as a monitor record."""
    f = event.fields
    serial = f.get("serial", "").rstrip(":")
    out: dict[str, Any] = {
        "time": _now(),
        "source": "trace",
        "event": event.name,
        "kernel_time": event.timestamp,
        "memdev": f.get("memdev") or None,
        "serial": int(serial) if serial.lstrip("-").isdecimal() else None,
        "host": f.get("host") or None,
        "hpa": _address(f.get("hpa")),
        "dpa": _address(f.get("dpa")),
    }
    locator.locate(out, f.get("region") or None, out["hpa"])
    out["fields"] = dict(f)
    return out


def uevent_record(action: str, subsystem: str, name: str, locator: Locator) -> dict[str, Any]:
    """One hotplug uevent as a monitor record (memory blocks located by address)."""
    out: dict[str, Any] = {
        "time": _now(),
        "source": "uevent",
        "event": f"{subsystem} {action}",
        "action": action,
        "subsystem": subsystem,
        "device": name,
    }
    hpa = None
    if subsystem == "memory" and name.startswith("memory") and name[6:].isdecimal():
        fs = locator.fs
        block_size = fs.read(f"{MEMORY_DIR}/block_size_bytes")
        if block_size:
            hpa = int(name[6:]) * int(block_size, 16)
        nodes = [d for d in fs.listdir(f"{MEMORY_DIR}/{name}") if d.startswith("node")]
        if nodes and nodes[0][4:].isdecimal():
            out["node"] = int(nodes[0][4:])
    out["hpa"] = hpa
    locator.locate(out, name if name.startswith("region") else None, hpa)
    return out


def monitor(
    *,
    count: int | None = None,
    duration: float | None = None,
    system: System | None = None,
    on_ready: Callable[[Sequence[str]], None] | None = None,
) -> Generator[dict[str, Any], None, None]:
    """Events as they come, until ``count`` events or ``duration`` seconds (forever by
    default). Close the iterator (or leave the ``for``) to stop: the trace instance is
    removed (and tracefs unmounted, if it was mounted for it). Needs root (tracefs).
    ``on_ready`` is called once both sources listen, with the trace events this kernel
    lacks (the stream goes on without them): nothing that happens after it is missed.
    ``system``: the host, as read (default: read now)."""
    import pyudev  # the monitor is the only user

    if count is not None:
        count = whole_count(count, "count (events)")
    if duration is not None:
        duration = finite(duration, "duration (seconds)")
    host = given_or_read(system, gpus=False)
    fs = host.sysfs()
    if fs.root != "/":  # the events are this machine's; a tree's names would misplace them
        raise InvalidRequestError(
            f"monitoring needs this machine's kernel, not the recorded tree {fs.root}: "
            f"leave --sysroot and {SYSROOT_ENV} unset"
        )
    locator = Locator(host)
    context = pyudev.Context()
    try:
        uevents = pyudev.Monitor.from_netlink(context, source="kernel")
    except Exception as e:  # pyudev raises plain OSError/RuntimeError subclasses here
        raise NotAvailableError(f"cannot listen to kernel uevents: {e}") from e
    trace = TraceInstance(TRACE_EVENTS, fs)
    try:
        uevents.start()
        if on_ready is not None:
            on_ready(trace.missing)
        deadline = None if duration is None else time.monotonic() + duration
        sent = 0
        while count is None or sent < count:
            wait = POLL_S
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return
            ready, _, _ = select.select([uevents.fileno(), trace.fileno()], [], [], wait)
            batch: list[dict[str, Any]] = []
            if uevents.fileno() in ready:
                hotplug: list[tuple[str, str, str]] = []
                while (dev := uevents.poll(timeout=0)) is not None:
                    if dev.subsystem in UEVENT_SUBSYSTEMS:
                        hotplug.append((dev.action or "change", dev.subsystem, dev.sys_name))
                if hotplug:
                    locator.refresh()  # a region or node may have come or gone
                batch = [uevent_record(a, s, n, locator) for a, s, n in hotplug]
            batch += [trace_record(ev, locator) for ev in trace.read()]
            for rec in batch:
                yield rec
                sent += 1
                if count is not None and sent >= count:
                    return
    finally:
        trace.close()


def append_log(path: str, record: dict[str, Any]) -> None:
    """Append one record to the event log ``pycxl check`` reads (one JSON line, flushed
    and synced: a record is in the log before it is shown)."""
    append_line(path, json.dumps(record, sort_keys=True))
