"""What ``pycxl check`` reports: a finding with a severity, about a subject, with a fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ..base.jsontype import Json

if TYPE_CHECKING:
    from ..cxl.model import Memdev

Severity = Literal["ok", "info", "warning", "failure"]
SEVERITIES: tuple[Severity, ...] = ("ok", "info", "warning", "failure")


@dataclass(frozen=True)
class Finding:
    """One result of a check: how bad, about what, what was seen, what to do."""

    severity: Severity
    check: str  # short id: memdev-enabled, health, region-online, pcie-link...
    subject: str  # mem0, region0, cxl0, 0000:1b:00.0, host
    message: str
    fix: str = ""
    labels: dict[str, str] = field(default_factory=dict, hash=False)  # memdev, region, node...


def memdev_labels(m: Memdev) -> dict[str, str]:
    """The labels of a finding about a memdev: its name and serial (names can change
    across boots)."""
    return {"memdev": m.name, "serial": "" if m.serial is None else hex(m.serial)}


def finding_json(f: Finding) -> Json:
    """One finding of ``pycxl check``: severity, check, subject, message, fix, labels."""
    return {
        "severity": f.severity,
        "check": f.check,
        "subject": f.subject,
        "message": f.message,
        "fix": f.fix or None,
        "labels": f.labels,
    }
