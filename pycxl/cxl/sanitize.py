"""A memdev sanitized (every byte of its media overwritten, labels included) or
securely erased (its encryption keys changed), through the kernel's
``security/sanitize`` and ``security/erase``, and the wait for it to finish (ndctl's
``wait-sanitize``).

The kernel refuses both while the memdev decodes an active region (EBUSY); that is
said first. Neither can be undone: a device with persistent capacity, whose data
would be lost, needs ``force``.
"""

from __future__ import annotations

from ..base.errors import InvalidRequestError, NotAvailableError
from ..base.plan import Plan, write
from ..base.sysfs import Sysfs
from ..base.values import finite
from ..base.waiting import wait_until
from . import device_ops
from .device_ops import CXL_DEVICES, DeviceResult
from .model import Memdev
from .read import SANITIZING, security_state


def sanitize(
    memdev: str,
    *,
    erase: bool = False,
    force: bool = False,
    wait: bool = False,
    timeout: float | None = None,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Start a sanitize (``erase``: a secure erase) of ``memdev``; with ``wait``, return
    once it has finished (``timeout`` seconds at most)."""
    memdev, erase = device_ops.name(memdev, "memdev"), device_ops.flag(erase, "erase")
    force, wait, dry_run = (
        device_ops.flag(force, "force"),
        device_ops.flag(wait, "wait"),
        device_ops.flag(dry_run, "dry_run"),
    )
    fs = device_ops.host(system)
    topo = device_ops.topology(fs)
    m = topo.find_memdev(memdev)
    attr = "erase" if erase else "sanitize"
    path = f"{CXL_DEVICES}/{m.name}/security/{attr}"
    if not fs.exists(path):
        raise NotAvailableError(
            f"{m.name} has no security/{attr}: its device does not support "
            f"{'Secure Erase' if erase else 'Sanitize'}"
        )
    _refuse_busy(m, attr)
    if m.pmem_size and not force:
        raise InvalidRequestError(
            f"{m.name} has {m.pmem_size >> 20} MiB of persistent capacity: {attr} destroys "
            "its data and labels for good; pass --force if that is intended"
        )
    if timeout is not None:
        timeout = finite(timeout, "--timeout")
    what = "overwrite all of" if not erase else "securely erase (change the keys of)"
    step = write(f"{what} {m.name}'s media (cannot be undone)", path, "1")
    plan = Plan(f"{attr} {m.name}", (step,))
    done = device_ops.run(fs, m.name, plan, dry_run=dry_run, what=attr)
    details: dict[str, object] = {}
    if done and wait:
        details["waited_s"] = _wait(fs, m.name, timeout)
    if done:
        details["state"] = security_state(fs, m.name)
    return DeviceResult(m.name, plan, done, memdev=m, details=details)


def _refuse_busy(m: Memdev, what: str) -> None:
    ep = m.endpoint
    if ep is not None and ep.decoders_committed:
        regions = ", ".join(r.name for r in m.regions) or "a region"
        raise InvalidRequestError(
            f"{m.name} decodes {regions}: the kernel refuses to {what} a device in an active "
            "region; destroy the region first (pycxl region destroy)"
        )


def wait_sanitize(
    memdev: str,
    *,
    timeout: float | None = None,
    system: device_ops.Host | None = None,
) -> float:
    """Wait until ``memdev``'s sanitize has finished (at once when none runs); the
    seconds waited. ``timeout`` None waits as long as it takes."""
    memdev = device_ops.name(memdev, "memdev")
    fs = device_ops.host(system)
    m = device_ops.topology(fs).find_memdev(memdev)
    if timeout is not None:
        timeout = finite(timeout, "--timeout")
    return _wait(fs, m.name, timeout)


def _wait(fs: Sysfs, memdev: str, timeout: float | None) -> float:
    import time

    start = time.monotonic()
    if security_state(fs, memdev) is None:
        return 0.0  # no security interface: nothing can be running (as ndctl)
    wait_until(
        lambda: True if security_state(fs, memdev) != SANITIZING else None,
        what=f"{memdev}'s sanitize to finish",
        timeout=timeout if timeout is not None else float("inf"),
        live=False,
    )
    return time.monotonic() - start
