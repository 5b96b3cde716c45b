"""Device health from the mailbox, decoded from the CXL specification's payload layouts
(Get Health Info, Get Alert Configuration, Get FW Info), with ndctl's field names.

The decoders take the raw output payload, so they are checked against payloads built
from the specification's tables as well as against what a device (QEMU's, in the
testbed) answers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from .mailbox import GET_ALERT_CONFIG, GET_FW_INFO, GET_HEALTH_INFO, Mailbox, Unsupported

# Get Health Info (CXL 2.0 8.2.9.5.3.1): health status, media status, additional
# status, life used, temperature (s16, C), dirty shutdowns, corrected volatile and
# persistent error counts.
HEALTH = struct.Struct("<BBBBhIII")
HEALTH_STATUS_BITS = {
    "maintenance_needed": 0x1,
    "performance_degraded": 0x2,
    "hw_replacement_needed": 0x4,
}
MEDIA_STATUS = {
    0: "media_normal",
    1: "media_not_ready",
    2: "media_persistence_lost",
    3: "media_data_lost",
    4: "media_powerloss_persistence_loss",
    5: "media_shutdown_persistence_loss",
    6: "media_persistence_loss_imminent",
    7: "media_powerloss_data_loss",
    8: "media_shutdown_data_loss",
    9: "media_data_loss_imminent",
}
LEVELS = {0: "normal", 1: "warning", 2: "critical"}

# Get Alert Configuration (8.2.9.5.3.2): valid alerts, programmable alerts, life used
# critical and warning thresholds (%), over/under temperature critical and warning
# thresholds (s16, C), corrected volatile and persistent error warning thresholds.
ALERT = struct.Struct("<BBBBhhhhHH")
ALERT_KINDS = (
    ("life_used_prog_warn_threshold", 0x1),
    ("dev_over_temperature_prog_warn_threshold", 0x2),
    ("dev_under_temperature_prog_warn_threshold", 0x4),
    ("corrected_volatile_mem_err_prog_warn_threshold", 0x8),
    ("corrected_pmem_err_prog_warn_threshold", 0x10),
)

# Get FW Info (8.2.9.2.1): slots supported, slot info (active slot in bits 2:0, the
# slot staged for the next reset in bits 5:3), activation capabilities (bit 0: online),
# then four 16-byte revision strings at offset 16.
FW_HEADER = struct.Struct("<BBB")


@dataclass(frozen=True)
class Health:
    """Decoded Get Health Info."""

    health_status: int
    media_status: int
    additional_status: int
    life_used: int  # percent; 0xFF: not reported
    temperature: int  # C; 0xFFFF (-1 as s16): not reported
    dirty_shutdowns: int
    volatile_errors: int
    pmem_errors: int

    def ext(self, shift: int) -> str:
        """A 2-bit field of the additional status: normal, warning, critical."""
        return LEVELS.get((self.additional_status >> shift) & 0x3, "unknown")

    def ext_flag(self, bit: int) -> str:
        """A 1-bit field of the additional status: normal or warning."""
        return "warning" if self.additional_status >> bit & 1 else "normal"

    @property
    def problems(self) -> list[str]:
        """What is wrong, in words (empty when healthy)."""
        out = [k.replace("_", " ") for k, bit in HEALTH_STATUS_BITS.items()
               if self.health_status & bit]  # fmt: skip
        if self.media_status != 0:
            media = MEDIA_STATUS.get(self.media_status, f"media status {self.media_status}")
            out.append(media.replace("_", " "))
        for name, level in (("life used", self.ext(0)), ("temperature", self.ext(2)),
                            ("corrected volatile errors", self.ext_flag(4)),
                            ("corrected persistent errors", self.ext_flag(5))):  # fmt: skip
            if level in ("warning", "critical"):
                out.append(f"{name} {level}")
        return out

    @property
    def critical(self) -> bool:
        """A failure, not a warning: replacement needed, data lost, or a critical level."""
        return bool(
            self.health_status & 0x4
            or self.media_status in (2, 3, 7, 8, 9)
            or "critical" in (self.ext(0), self.ext(2))
        )


def decode_health(payload: bytes) -> Health:
    """Get Health Info's 18-byte output."""
    return Health(*HEALTH.unpack(payload[: HEALTH.size]))


# kernel's trace flag names -> bits of the health status; media status names -> codes
_STATUS_BITS = {"MAINTENANCE_NEEDED": 0x1, "PERFORMANCE_DEGRADED": 0x2, "REPLACEMENT_NEEDED": 0x4}
# (the kernel's names are ndctl's, upper case, without 'media_')
_MEDIA = {name.removeprefix("media_").upper(): code for code, name in MEDIA_STATUS.items()}
_LEVEL = {name.upper(): code for code, name in LEVELS.items()}


def event_health(ev: dict[str, Any]) -> Health:
    """The device health a memory-module event reports (the kernel's cxl_memory_module
    trace fields, as the monitor logs them): the same facts as Get Health Info."""
    f = ev.get("fields", {})
    status = 0
    for flag in str(f.get("health_status", "")).split("|"):
        status |= _STATUS_BITS.get(flag.strip(), 0)
    additional = (
        _LEVEL.get(str(f.get("as_life_used", "")).upper(), 0)
        | _LEVEL.get(str(f.get("as_dev_temp", "")).upper(), 0) << 2
        | (str(f.get("as_cor_vol_err_cnt", "")).upper() == "WARNING") << 4
        | (str(f.get("as_cor_per_err_cnt", "")).upper() == "WARNING") << 5
    )
    return Health(
        health_status=status,
        media_status=_MEDIA.get(str(f.get("media_status", "NORMAL")).upper(), 0),
        additional_status=additional,
        life_used=_int(f.get("life_used"), 0xFF),
        temperature=_int(f.get("device_temp"), -1),
        dirty_shutdowns=_int(f.get("dirty_shutdown_cnt"), 0),
        volatile_errors=_int(f.get("cor_vol_err_cnt"), 0),
        pmem_errors=_int(f.get("cor_per_err_cnt"), 0),
    )


def _int(value: Any, default: int) -> int:
    try:
        return int(str(value), 0)
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class AlertConfig:
    """Decoded Get Alert Configuration."""

    valid: int
    programmable: int
    life_used_crit: int
    life_used_warn: int
    over_temp_crit: int
    under_temp_crit: int
    over_temp_warn: int
    under_temp_warn: int
    volatile_err_warn: int
    pmem_err_warn: int


def decode_alert_config(payload: bytes) -> AlertConfig:
    """Get Alert Configuration's 16-byte output."""
    return AlertConfig(*ALERT.unpack(payload[: ALERT.size]))


@dataclass(frozen=True)
class FirmwareInfo:
    """Decoded Get FW Info: slots, the active one, each slot's revision."""

    slots: int
    active_slot: int
    revisions: tuple[str, ...]
    staged_slot: int = 0  # the slot activated at the next reset (0: none)
    online_activate: bool = False  # the device can activate a new image while running


def decode_fw_info(payload: bytes) -> FirmwareInfo:
    """Get FW Info's 80-byte output."""
    slots, info, caps = FW_HEADER.unpack(payload[: FW_HEADER.size])
    revisions = tuple(
        payload[16 + 16 * i : 32 + 16 * i].split(b"\0", 1)[0].decode("ascii", "replace").strip()
        for i in range(4)
    )
    return FirmwareInfo(slots, info & 0x7, revisions[: max(slots, 1)], info >> 3 & 0x7,
                        bool(caps & 0x1))  # fmt: skip


@dataclass(frozen=True)
class DeviceHealth:
    """What one memdev's mailbox said: each part, or why it could not say it."""

    memdev: str
    health: Health | Unsupported
    alert_config: AlertConfig | Unsupported
    firmware: FirmwareInfo | Unsupported


def read_health(
    memdev: str, dev_dir: str = "/dev/cxl", device: tuple[int, int] | None = None
) -> DeviceHealth:
    """Health, alert configuration and firmware information of ``memdev``. A command the
    device or kernel does not support is an ``Unsupported`` in its place. ``device``: the
    memdev's (major, minor), which its node must be (``Mailbox``)."""
    with Mailbox(memdev, dev_dir, device) as mbox:
        health = mbox.send(GET_HEALTH_INFO)
        alert = mbox.send(GET_ALERT_CONFIG)
        fw = mbox.send(GET_FW_INFO)
    return DeviceHealth(
        memdev,
        decode_health(health) if isinstance(health, bytes) else health,
        decode_alert_config(alert) if isinstance(alert, bytes) else alert,
        decode_fw_info(fw) if isinstance(fw, bytes) else fw,
    )
