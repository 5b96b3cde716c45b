"""A memdev's warning thresholds set through the mailbox (Set Alert Configuration), as
ndctl's ``set-alert-config``: for each of life used, over and under temperature, and
corrected volatile and persistent error counts, an alert turned on with a threshold or
turned off.

The request is checked whole before the mailbox is opened (a threshold without
``on``, ``on`` without a threshold, a value out of the field's range); the device's
configuration before the change is read first and written back if a later step fails.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..base.errors import InvalidRequestError
from ..base.plan import Plan, Undo, action
from ..base.sysfs import Sysfs
from . import device_ops
from .device_ops import DeviceResult
from .health import ALERT_KINDS, AlertConfig, decode_alert_config
from .mailbox import GET_ALERT_CONFIG, SET_ALERT_CONFIG

# valid actions, enable actions, life used (%), reserved, over and under temperature
# (s16, C), corrected volatile and persistent error counts (CXL 3.1 8.2.9.9.3.3)
SET_ALERT = struct.Struct("<BBBBhhHH")

# what ndctl calls each alert, its bit, and the range its threshold field holds
ALERTS = {
    "life_used": (0x1, 0, 100),
    "over_temperature": (0x2, -(1 << 15), (1 << 15) - 1),
    "under_temperature": (0x4, -(1 << 15), (1 << 15) - 1),
    "volatile_mem_err": (0x8, 0, (1 << 16) - 1),
    "pmem_err": (0x10, 0, (1 << 16) - 1),
}
assert [bit for bit, _, _ in ALERTS.values()] == [bit for _, bit in ALERT_KINDS]


@dataclass(frozen=True)
class AlertChange:
    """One alert turned on at ``threshold``, or off (``threshold`` None); checked when
    made, as the command line's options are (``alert_change``), so a plan never holds an
    alert or a threshold the device cannot take."""

    alert: str
    enable: bool
    threshold: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.alert, str) or self.alert not in ALERTS:
            raise InvalidRequestError(f"alert {self.alert!r}: use {', '.join(ALERTS)}")
        device_ops.flag(self.enable, "enable")
        flag = self.alert.replace("_", "-")
        if not self.enable:
            if self.threshold is not None:
                raise InvalidRequestError(f"--{flag}-alert off takes no threshold; leave "
                                          f"--{flag}-threshold out")  # fmt: skip
            return
        if self.threshold is None:
            raise InvalidRequestError(f"--{flag}-alert on needs --{flag}-threshold N")
        _, low, high = ALERTS[self.alert]
        whole = isinstance(self.threshold, int) and not isinstance(self.threshold, bool)
        if not whole or not low <= self.threshold <= high:
            raise InvalidRequestError(f"--{flag}-threshold {self.threshold!r}: give a whole "
                                      f"number from {low} to {high}")  # fmt: skip


def alert_change(alert: str, state: str | None, threshold: int | None) -> AlertChange | None:
    """What ``--<alert>-alert on|off`` and ``--<alert>-threshold N`` ask for, checked as
    ndctl checks them (None: neither was given); ``AlertChange`` checks the rest."""
    if not isinstance(alert, str) or alert not in ALERTS:
        raise InvalidRequestError(f"alert {alert!r}: use {', '.join(ALERTS)}")
    flag = alert.replace("_", "-")
    if state is None:
        if threshold is not None:
            raise InvalidRequestError(f"--{flag}-threshold needs --{flag}-alert on")
        return None
    if state not in ("on", "off"):
        raise InvalidRequestError(f"--{flag}-alert {state!r}: use on or off")
    return AlertChange(alert, state == "on", threshold)


def alert_payload(changes: list[AlertChange], before: AlertConfig | None = None) -> bytes:
    """Set Alert Configuration's input for ``changes``; thresholds not changed keep the
    values ``before`` had."""
    fields = {
        "life_used": before.life_used_warn if before else 0,
        "over_temperature": before.over_temp_warn if before else 0,
        "under_temperature": before.under_temp_warn if before else 0,
        "volatile_mem_err": before.volatile_err_warn if before else 0,
        "pmem_err": before.pmem_err_warn if before else 0,
    }
    valid = enable = 0
    for c in changes:
        bit = ALERTS[c.alert][0]
        valid |= bit
        if c.enable:
            enable |= bit
            fields[c.alert] = c.threshold or 0
    return SET_ALERT.pack(valid, enable, fields["life_used"], 0, fields["over_temperature"],
                          fields["under_temperature"], fields["volatile_mem_err"],
                          fields["pmem_err"])  # fmt: skip


def _restore_payload(changes: list[AlertChange], before: AlertConfig) -> bytes:
    """What puts the changed alerts back as ``before`` had them."""
    back = [AlertChange(c.alert, bool(before.valid & ALERTS[c.alert][0]),
                        _threshold(before, c.alert)) for c in changes]  # fmt: skip
    return alert_payload(back, before)


def _threshold(cfg: AlertConfig, alert: str) -> int:
    return {
        "life_used": cfg.life_used_warn,
        "over_temperature": cfg.over_temp_warn,
        "under_temperature": cfg.under_temp_warn,
        "volatile_mem_err": cfg.volatile_err_warn,
        "pmem_err": cfg.pmem_err_warn,
    }[alert]


def set_alert_config(
    memdev: str,
    changes: list[AlertChange],
    *,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Turn ``memdev``'s warning alerts on (with thresholds) or off."""
    memdev, dry_run = device_ops.name(memdev, "memdev"), device_ops.flag(dry_run, "dry_run")
    if not isinstance(changes, list | tuple) or not all(
        isinstance(c, AlertChange) for c in changes
    ):
        raise InvalidRequestError("changes: give a list of AlertChange (see alert_change)")
    changes = list(changes)
    if not changes:
        raise InvalidRequestError(
            "no alert named: give at least one --<alert>-alert on|off (life-used, "
            "over-temperature, under-temperature, volatile-mem-err, pmem-err)"
        )
    fs = device_ops.host(system)
    m = device_ops.topology(fs).find_memdev(memdev)
    what = "setting alert thresholds"
    if not dry_run:
        device_ops.require_root(fs, "setting alert thresholds (a mailbox command)")
        with device_ops.mailbox(fs, m.name, what) as mbox:
            for cmd in (GET_ALERT_CONFIG, SET_ALERT_CONFIG):  # both, before any change
                mbox.check_allowed(cmd)

    def apply(_: Sysfs) -> Undo:
        with device_ops.mailbox(fs, m.name, what) as mbox:
            before = decode_alert_config(mbox.call(GET_ALERT_CONFIG, out_size=0x10))
            mbox.call(SET_ALERT_CONFIG, alert_payload(changes, before))

        def restore(_: Sysfs) -> None:
            with device_ops.mailbox(fs, m.name, what) as mb:
                mb.call(SET_ALERT_CONFIG, _restore_payload(changes, before))

        return restore

    said = ", ".join(f"{c.alert} {'on at ' + str(c.threshold) if c.enable else 'off'}"
                     for c in changes)  # fmt: skip
    plan = Plan(f"set-alert-config {m.name}",
                (action(f"Set Alert Configuration on {m.name}: {said} (the configuration "
                        "before is read first and restored on failure)", apply),))  # fmt: skip
    done = device_ops.run(fs, m.name, plan, dry_run=dry_run, what="setting alert thresholds")
    details = {}
    if done:
        with device_ops.mailbox(fs, m.name, what) as mbox:
            details["alert_config"] = decode_alert_config(mbox.call(GET_ALERT_CONFIG,
                                                                    out_size=0x10))  # fmt: skip
    return DeviceResult(m.name, plan, done, memdev=m, details=details)
