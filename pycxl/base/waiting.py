"""Waiting for the kernel to finish something asynchronous (a driver probing a device).

The condition is always re-read from sysfs; kernel uevents (through pyudev's netlink
monitor, which needs no udev daemon) only wake the wait early. Where no monitor can be
opened (tests on a recorded tree, no libudev), it polls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from ._log import get_logger
from .errors import OperationError

T = TypeVar("T")
log = get_logger(__name__)

POLL_S = 0.05


def wait_until(
    check: Callable[[], T | None],
    *,
    what: str,
    timeout: float,
    subsystem: str | None = None,
    live: bool = True,
) -> T:
    """Return check()'s first non-None value; OperationError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    monitor = _monitor(subsystem) if live else None
    while True:
        result = check()
        if result is not None:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise OperationError(f"timed out after {timeout:.0f} s waiting for {what}")
        if monitor is not None:
            monitor.poll(timeout=min(remaining, 0.5))
        else:
            time.sleep(min(remaining, POLL_S))


def _monitor(subsystem: str | None) -> Any:
    try:
        import pyudev

        monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
        if subsystem:
            monitor.filter_by(subsystem)
        monitor.start()
        return monitor
    except Exception as e:  # no libudev, no netlink: polling works everywhere
        log.debug("no uevent monitor (%s); polling", e)
        return None
