"""What memdevs' own mailboxes say, for ``pycxl list -H/-A/-L``: health, alert
thresholds and poison, each read only where asked, and its JSON (ndctl's keys)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..base.errors import PycxlError

if TYPE_CHECKING:
    from ..base.jsontype import Json
    from ..cxl.health import DeviceHealth
    from ..cxl.mailbox import Unsupported
    from ..cxl.model import Memdev
    from ..cxl.poison import PoisonRecord
    from ..resolve.system import System


class DeviceQuestions(Protocol):
    """What a listing asks of the memdevs' mailboxes (``listing.ListRequest`` is one):
    named here, so this module needs nothing from the listing that calls it."""

    @property
    def device_info(self) -> bool:
        """Whether any of the three below is asked."""
        ...

    @property
    def health(self) -> bool:
        """The memdevs' health (``-H``)."""
        ...

    @property
    def alert_config(self) -> bool:
        """Their alert thresholds (``-A``)."""
        ...

    @property
    def media_errors(self) -> bool:
        """Their poison lists (``-L``)."""
        ...


@dataclass(frozen=True)
class DeviceInfo:
    """One memdev's mailbox answers (or why there are none) and its poison list."""

    health: DeviceHealth | None = None
    unavailable: str | None = None  # why the mailbox was not read at all
    poison: list[PoisonRecord] | Unsupported | None = None


def read_device_info(
    system: System, memdevs: Sequence[Memdev], req: DeviceQuestions
) -> dict[str, DeviceInfo]:
    """Health, alert configuration and poison of each memdev, as ``req`` asks. Without
    root, or for a recorded tree (its devices are not on this machine), each says so; a
    device that refuses a command is reported, the rest go on."""
    if not req.device_info or not memdevs:
        return {}
    from ..cxl.device_ops import device_numbers
    from ..cxl.health import read_health
    from ..cxl.poison import read_poison

    if system.sysroot != "/":
        away = f"a recorded tree ({system.sysroot}): its devices are not here to ask"
        return {m.name: DeviceInfo(unavailable=away) for m in memdevs}
    if os.geteuid() != 0:
        root = "needs root: health, alerts and poison come from the device's mailbox"
        return {m.name: DeviceInfo(unavailable=root) for m in memdevs}
    out: dict[str, DeviceInfo] = {}
    poison: dict[str, list[PoisonRecord] | Unsupported] = {}
    if req.media_errors:
        poison = read_poison([m.name for m in memdevs if m.enabled])
    for m in memdevs:
        health: DeviceHealth | None = None
        why: str | None = None
        if req.health or req.alert_config:
            try:
                health = read_health(m.name, device=device_numbers(system.sysfs(), m.name))
            except PycxlError as e:  # this device's mailbox; the others go on
                why = str(e)
        out[m.name] = DeviceInfo(health, why, poison.get(m.name))
    return out


def device_json(system: System, info: DeviceInfo, req: DeviceQuestions) -> Json:
    """The keys ``-H``, ``-A`` and ``-L`` add to a memdev (ndctl's names); what could not
    be read is under ``<key>_unsupported`` with the reason."""
    from ..cxl.health import Health
    from ..cxl.mailbox import Unsupported
    from .to_json import alert_config_json, health_json

    out: Json = {}
    parts = [("health", req.health), ("alert_config", req.alert_config)]
    for key, wanted in parts:
        if not wanted:
            continue
        h = info.health
        value = None if h is None else (h.health if key == "health" else h.alert_config)
        if value is None:
            out[f"{key}_unsupported"] = info.unavailable
        elif isinstance(value, Unsupported):
            out[f"{key}_unsupported"] = f"{value.command}: {value.reason}"
        elif isinstance(value, Health):
            out[key] = health_json(value)
        else:
            out[key] = alert_config_json(value)
    if req.media_errors:
        if isinstance(info.poison, list):
            out["media_errors"] = [_media_error_json(system, r) for r in info.poison]
        else:
            out["media_errors_unsupported"] = (
                info.poison.reason if isinstance(info.poison, Unsupported)
                else info.unavailable or "the memdev is disabled")  # fmt: skip
    return out


def _media_error_json(system: System, r: PoisonRecord) -> Json:
    from .to_json import poison_record_json

    region = next((x for x in system.cxl.regions if x.name == r.region), None)
    node = region.numa_nodes[0] if region is not None and region.numa_nodes else None
    return poison_record_json(r) | {"numa_node": node, "target": system.tier_name(node)}
