"""PCIe link state of a device, from the kernel's PCI sysfs attributes
(``current_link_speed``/``max_link_speed``, ``current_link_width``/``max_link_width``).

A link's best possible state is the lower of what the device and its upstream port can
do: a Gen5 device in a Gen4 slot is limited by the slot, not broken. What ``lspci -vv``
prints as LnkSta against LnkCap is the link now against the device's own maximum
(``lspci_text``); what the link carries, per direction, after its line encoding, is
``bandwidth``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..base.sysfs import Sysfs
from .devices import PCI_DEVICES

_SPEED = re.compile(r"^\s*([0-9.]+)\s*GT/s")
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class Link:
    """A device's link now and at best (GT/s per lane, lanes); None where unknown."""

    device: str  # PCI address
    speed: float | None
    width: int | None
    max_speed: float | None  # what the device and its upstream port both support
    max_width: int | None
    limited_by_port: bool  # the upstream port, not the device, sets the maximum
    device_max_unknown: bool = False  # the device's own maximum could not be read
    device_max_speed: float | None = None  # the device's own (lspci's LnkCap)
    device_max_width: int | None = None

    @property
    def speed_below_max(self) -> bool:
        """Whether the link runs slower than both ends allow."""
        return self.speed is not None and self.max_speed is not None and self.speed < self.max_speed

    @property
    def width_below_max(self) -> bool:
        """Whether the link has fewer lanes than both ends allow."""
        return self.width is not None and self.max_width is not None and self.width < self.max_width

    def describe(self) -> str:
        """'16.0 GT/s x8 of 32.0 GT/s x16'."""
        return f"{_fmt(self.speed, self.width)} of {_fmt(self.max_speed, self.max_width)}"

    @property
    def downgraded(self) -> bool:
        """Whether the link runs below the device's own maximum (lspci's '(downgraded)')."""
        return _below(self.speed, self.device_max_speed) or _below(
            self.width, self.device_max_width
        )

    def lspci_text(self) -> str:
        """The link now as lspci -vv writes LnkSta, against the device's LnkCap where it
        is below it: '32GT/s x16', '2.5GT/s (downgraded) x16 of 32GT/s x16'."""
        speed = _lspci_speed(self.speed) + (
            " (downgraded)" if _below(self.speed, self.device_max_speed) else ""
        )
        width = f"x{self.width if self.width is not None else '?'}" + (
            " (downgraded)" if _below(self.width, self.device_max_width) else ""
        )
        if not self.downgraded:
            return f"{speed} {width}"
        cap = f"{_lspci_speed(self.device_max_speed)} x{self.device_max_width or '?'}"
        return f"{speed} {width} of {cap}"

    def bandwidth(self, *, best_speed: bool = False) -> float | None:
        """Bytes per second the link carries in each direction at its width now and its
        speed now (``best_speed``: the most both ends support, which a GPU runs at under
        load however low it idles); None where a figure is unknown."""
        speed = self.max_speed if best_speed and self.max_speed is not None else self.speed
        return bandwidth(speed, self.width)


def _below(now: float | None, cap: float | None) -> bool:
    return now is not None and cap is not None and now < cap


def _lspci_speed(speed: float | None) -> str:
    return "?GT/s" if speed is None else f"{speed:g}GT/s"


def encoding_efficiency(speed: float) -> float:
    """The share of a lane's transfers that carry data: 8b/10b up to 5 GT/s (Gen1-2),
    128b/130b at 8-32 GT/s (Gen3-5), 242 of 256 bytes per FLIT at 64 GT/s (Gen6)."""
    if speed <= 5.0:
        return 8 / 10
    if speed <= 32.0:
        return 128 / 130
    return 242 / 256


def bandwidth(speed: float | None, width: int | None) -> float | None:
    """Bytes per second of ``width`` lanes at ``speed`` GT/s, per direction, after the
    line encoding (before packet headers): 63.0 GB/s for 32 GT/s x16."""
    if speed is None or width is None:
        return None
    return speed * 1e9 * width * encoding_efficiency(speed) / 8


def _fmt(speed: float | None, width: int | None) -> str:
    s = f"{speed:.1f} GT/s" if speed is not None else "? GT/s"
    return f"{s} x{width}" if width is not None else f"{s} x?"


def parse_speed(text: str | None) -> float | None:
    """'32.0 GT/s PCIe' -> 32.0; 'Unknown' or absent -> None."""
    m = _SPEED.match(text or "")
    return float(m.group(1)) if m else None


def _width(fs: Sysfs, rel: str) -> int | None:
    value = fs.read_int(rel)
    return value if value else None  # the kernel prints 0 for an unknown width


def read_link(device: str, fs: Sysfs | None = None) -> Link | None:
    """The link of PCI device ``device`` ('0000:0d:00.0'); None when it has no link
    attributes (not a PCIe device, or an integrated one)."""
    fs = fs or Sysfs()
    base = f"{PCI_DEVICES}/{device}"
    speed = parse_speed(fs.read(f"{base}/current_link_speed"))
    dev_max = parse_speed(fs.read(f"{base}/max_link_speed"))
    if speed is None and dev_max is None:
        return None
    width = _width(fs, f"{base}/current_link_width")
    dev_max_width = _width(fs, f"{base}/max_link_width")
    max_speed, max_width, by_port = dev_max, dev_max_width, False
    upstream = os.path.basename(os.path.dirname(fs.realpath(base)))
    if _BDF.match(upstream):
        port = f"{PCI_DEVICES}/{upstream}"
        port_speed = parse_speed(fs.read(f"{port}/max_link_speed"))
        port_width = _width(fs, f"{port}/max_link_width")
        if port_speed is not None and (max_speed is None or port_speed < max_speed):
            max_speed, by_port = port_speed, True
        if port_width is not None and (max_width is None or port_width < max_width):
            max_width, by_port = port_width, True
    unknown = dev_max is None or dev_max_width is None
    return Link(device, speed, width, max_speed, max_width, by_port, unknown, dev_max,
                dev_max_width)  # fmt: skip
