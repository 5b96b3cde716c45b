"""Findings the devices report themselves: mailbox health and warning thresholds,
poison lists, and the health in the monitor's event log where the mailbox did not
answer. The mailbox code loads only where it can be asked (root)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..base.errors import NeedsRootError, OperationError
from ..base.sysfs import Sysfs
from ..resolve.system import System
from .check_finding import Finding, Severity, memdev_labels

if TYPE_CHECKING:
    from ..cxl.health import DeviceHealth, Health
    from ..cxl.mailbox import Unsupported
    from ..cxl.model import Memdev
    from ..cxl.poison import PoisonRecord


def device_findings(
    system: System, fs: Sysfs, dev_dir: str
) -> tuple[dict[str, DeviceHealth], dict[str, list[PoisonRecord] | Unsupported], list[Finding]]:
    """The mailbox's health, warning thresholds and poison list of each enabled memdev
    (as root only; without root, one finding that says so), and what was read."""
    memdevs = [m for m in system.cxl.memdevs if m.enabled]
    if os.geteuid() != 0:
        return (
            {},
            {},
            [
                Finding(
                    "info",
                    "health",
                    "host",
                    "device health and poison lists were not read: they come from "
                    "the devices' mailboxes, which need root",
                    "run pycxl check as root",
                )
            ],
        )
    # the mailbox and poison code load only where they can be asked (root)
    from ..cxl.device_ops import device_numbers
    from ..cxl.health import read_health
    from ..cxl.mailbox import Unsupported
    from ..cxl.poison import read_poison

    out: list[Finding] = []
    health: dict[str, DeviceHealth] = {}
    for m in memdevs:
        labels = memdev_labels(m)
        try:
            h = read_health(m.name, dev_dir, device_numbers(fs, m.name))
        except (OperationError, NeedsRootError) as e:  # this device; the others go on
            out.append(
                Finding(
                    "warning",
                    "health",
                    m.name,
                    f"{m.name}: {e}",
                    "see dmesg for the device's mailbox",
                    labels,
                )
            )
            continue
        health[m.name] = h
        out.append(health_finding(m.name, h.health, labels, "the device"))
        alerts = alert_finding(m.name, h.alert_config, labels)
        if alerts is not None:
            out.append(alerts)
    try:
        poison = read_poison([m.name for m in memdevs], fs)
    except (OperationError, NeedsRootError) as e:
        out.append(Finding("warning", "poison", "host", f"poison lists not read: {e}"))
        return health, {}, out
    for m in memdevs:
        labels = memdev_labels(m)
        recs = poison.get(m.name)
        if isinstance(recs, Unsupported):
            out.append(
                Finding(
                    "info",
                    "poison",
                    m.name,
                    f"{m.name}: no poison list ({recs.reason})",
                    "",
                    labels,
                )
            )
        elif recs:
            where = sorted({_where(system, r) for r in recs})
            injected = sum(r.source == "Injected" for r in recs)
            if injected:  # a test of the alerting path, not a failing device
                where.append(f"({injected} injected: pycxl memdev clear-media-poison)")
            out.append(
                Finding(
                    "warning",
                    "poison",
                    m.name,
                    f"{m.name}: {len(recs)} poisoned range(s) " + ", ".join(where),
                    "reads there fail; the kernel takes such pages offline when it meets them: "
                    "plan to move work off this device",
                    labels,
                )
            )
        elif recs is not None:
            out.append(Finding("ok", "poison", m.name, f"{m.name}: no poison", "", labels))
    return health, poison, out


def _where(system: System, r: PoisonRecord) -> str:
    if r.region is None:
        return f"(dpa {r.dpa:#x}, in no region)"
    region = next((x for x in system.cxl.regions if x.name == r.region), None)
    node = region.numa_nodes[0] if region is not None and region.numa_nodes else None
    name = system.tier_name(node) if node is not None else None
    return f"(dpa {r.dpa:#x} in {r.region}" + (f", {name}" if name else "") + ")"


def health_finding(
    memdev: str, health: Health | Unsupported, labels: dict[str, str], source: str
) -> Finding:
    """One device's health, from the mailbox or the event log (``source``, in words)."""
    from ..cxl.mailbox import Unsupported

    if isinstance(health, Unsupported):
        return Finding(
            "info",
            "health",
            memdev,
            f"{memdev}: {health.command} not answered ({health.reason})",
            "",
            labels,
        )
    problems = health.problems
    if not problems:
        return Finding("ok", "health", memdev, f"{memdev}: healthy (from {source})", "", labels)
    sev: Severity = "failure" if health.critical else "warning"
    return Finding(
        sev,
        "health",
        memdev,
        f"{memdev}: {', '.join(problems)} (from {source})",
        "replace or service the device; move work off it first"
        if sev == "failure"
        else "plan maintenance of the device",
        labels,
    )


def event_findings(
    memdevs: Sequence[Memdev], events: Sequence[dict[str, Any]], health: dict[str, DeviceHealth]
) -> list[Finding]:
    """The latest memory-module event per device (by serial: names can change across
    boots) in the monitor's log; where the mailbox answered health itself, it wins."""
    from ..cxl.health import event_health
    from ..cxl.mailbox import Unsupported

    latest: dict[int, dict[str, Any]] = {}
    for record in events:
        if record.get("event") == "cxl_memory_module" and isinstance(record.get("serial"), int):
            latest[record["serial"]] = record
    out = []
    for m in memdevs:
        ev = latest.get(m.serial) if m.serial is not None else None
        answered = m.name in health and not isinstance(health[m.name].health, Unsupported)
        if ev is None or answered:
            continue
        out.append(
            health_finding(
                m.name, event_health(ev), memdev_labels(m), f"its event of {ev.get('time', '?')}"
            )
        )
    return out


def alert_finding(memdev: str, cfg: Any, labels: dict[str, str]) -> Finding | None:
    """The warning thresholds someone set on the device (set-alert-config), if any."""
    from ..cxl.alerts import ALERTS
    from ..cxl.health import AlertConfig

    if not isinstance(cfg, AlertConfig) or not cfg.valid:
        return None
    on = [f"{name.replace('_', ' ')} at {getattr(cfg, key)}"
          for (name, (bit, _, _)), key in zip(ALERTS.items(), _ALERT_KEYS, strict=True)
          if cfg.valid & bit]  # fmt: skip
    return Finding("info", "alert-config", memdev,
                   f"{memdev}: warning alerts set: {', '.join(on)}", "", labels)  # fmt: skip


_ALERT_KEYS = (  # the AlertConfig fields of ALERTS' warning thresholds, in their order
    "life_used_warn",
    "over_temp_warn",
    "under_temp_warn",
    "volatile_err_warn",
    "pmem_err_warn",
)
