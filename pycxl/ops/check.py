"""``pycxl check``: what would make a job on this host slow or wrong, as findings with
a severity and a fix.

Without expectations it checks consistency: every memdev enabled and healthy, in a
region, every region committed with its memory online, the zone of each CXL node
against GPU pinning, PCIe links at their best speed and width, device health (the
mailbox, the monitor's event log) and poison. Expectations (``cxl0=512G``,
``regions=2``, ``memdevs=4``) add what the job needs.

The checks are in rooms of their own: ``check_expect`` (the expectations' grammar),
``check_events`` (the monitor's event log), and the findings of ``check_objects``,
``check_capacity``, ``check_links`` and ``check_devices`` (``check_finding``: what
they report); this module runs them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..base.errors import InvalidRequestError, SysfsError
from ..base.sysfs import Sysfs
from ..pci.link import Link
from ..resolve.system import System
from .check_capacity import CAPACITY_SLACK, expectation_findings
from .check_devices import device_findings, event_findings
from .check_events import DEFAULT_EVENT_LOG, read_event_log
from .check_expect import Expectations, parse_expectations, read_expect_file
from .check_finding import SEVERITIES, Finding, Severity
from .check_links import link_findings, read_links
from .check_objects import (
    memdev_findings,
    operation_findings,
    region_findings,
    socket_findings,
    zone_findings,
)

if TYPE_CHECKING:  # imported where used: a host without CXL memdevs needs none of them
    from ..cxl.health import DeviceHealth
    from ..cxl.mailbox import Unsupported
    from ..cxl.poison import PoisonRecord

__all__ = [
    "CAPACITY_SLACK", "DEFAULT_EVENT_LOG", "SEVERITIES", "CheckReport", "Expectations",
    "Finding", "Severity", "parse_expectations", "read_event_log", "read_expect_file",
    "run_check",
]  # fmt: skip


@dataclass(frozen=True)
class CheckReport:
    """Every finding, and what was read on the way (for --json and the textfile)."""

    findings: tuple[Finding, ...]
    cxl_present: bool
    expected: bool = False  # expectations were given (and checked)
    health: dict[str, DeviceHealth] = field(default_factory=dict, hash=False)
    poison: dict[str, list[PoisonRecord] | Unsupported] = field(default_factory=dict, hash=False)
    links: dict[str, Link] = field(default_factory=dict, hash=False)

    @property
    def worst(self) -> Severity:
        """The worst severity found ('ok' when nothing is wrong)."""
        return max((f.severity for f in self.findings), key=SEVERITIES.index, default="ok")

    @property
    def status(self) -> str:
        """failure, warning, no-cxl (nothing wrong, but nothing CXL to check and nothing
        expected) or ok. Expectations that all held are ok, CXL or not: a job that
        asked only for dram0=1G on a host without CXL has what it needs."""
        worst = self.worst
        if worst in ("failure", "warning"):
            return worst
        return "ok" if self.cxl_present or self.expected else "no-cxl"


def run_check(
    system: System,
    expectations: Expectations | None = None,
    *,
    event_log: str | None = None,
    device_health: bool = True,
    fs: Sysfs | None = None,
    dev_dir: str = "/dev/cxl",
) -> CheckReport:
    """Check this host. ``event_log``: the JSON lines ``pycxl monitor --log`` writes
    (default: DEFAULT_EVENT_LOG when it exists; '' for none). ``device_health=False``
    skips the mailbox and the poison list (they need root). The report's status is
    no-cxl only when nothing is wrong, there is no CXL memory and nothing was expected.
    A system read from a recorded tree asks no device: its memdevs are not this
    machine's."""
    device_health = device_health and not system.recorded
    fs = fs or Sysfs()
    exp = expectations or Expectations()
    out: list[Finding] = []
    cxl = system.cxl
    memdevs = [m for m in cxl.memdevs]
    if not cxl.present or not memdevs:
        out.append(
            Finding(
                "info",
                "cxl-present",
                "host",
                "no CXL memory devices: "
                + (cxl.NO_BUS if not cxl.present else "the CXL bus has no memdevs"),
                "load the CXL drivers (modprobe cxl_acpi cxl_pci cxl_mem) if the "
                "host has CXL memory",
            )
        )
    for m in memdevs:
        out += memdev_findings(m)
        out += operation_findings(fs, m)
    for r in cxl.regions:
        out += region_findings(system, r)
        out += socket_findings(system, r)
    out += zone_findings(system, fs)
    out += expectation_findings(system, exp)
    links = read_links(system, fs)
    out += link_findings(system, links)
    health: dict[str, DeviceHealth] = {}
    poison: dict[str, list[PoisonRecord] | Unsupported] = {}
    if memdevs and device_health:
        health, poison, found = device_findings(system, fs, dev_dir)
        out += found
    if event_log:  # given: a file that is not the monitor's log is the caller's error
        events: list[dict[str, Any]] | Finding = read_event_log(event_log)
    elif event_log is None and os.path.exists(fs.path(DEFAULT_EVENT_LOG)):
        try:
            fs.check_in_tree(DEFAULT_EVENT_LOG)  # a tree's log is its own, never this host's
            events = read_event_log(fs.path(DEFAULT_EVENT_LOG))
        except (InvalidRequestError, SysfsError) as e:
            events = Finding("warning", "events", "host", str(e),
                             "check what writes there (pycxl monitor --log)")  # fmt: skip
    else:  # '' turns the log off
        events = []
    if isinstance(events, Finding):
        out.append(events)
    elif memdevs:
        out += event_findings(memdevs, events, health)
    return CheckReport(tuple(out), bool(memdevs), not exp.empty, health, poison, links)
