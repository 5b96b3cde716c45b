"""A memdev's firmware updated through the kernel's firmware-upload interface
(``/sys/class/firmware/memX``: ``loading``, ``data``, ``status``, ``remaining_size``,
``error``, ``cancel``), as ndctl's ``update-firmware`` does: the kernel transfers the
image to the device's next slot (Transfer FW) and activates it (Activate FW).

The image is checked before the transfer: a regular, readable, non-empty file whose
size is whole 128-byte units (the CXL specification's transfer granule); an update
already under way is not started over.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..base.errors import InvalidRequestError, NotAvailableError, OperationError, PycxlError
from ..base.plan import Plan, Step, Undo, action
from ..base.sysfs import Sysfs
from ..base.values import finite, input_file
from ..base.waiting import wait_until
from . import device_ops
from .device_ops import DeviceResult
from .health import FirmwareInfo, decode_fw_info
from .mailbox import GET_FW_INFO

LOADER = "/sys/class/firmware"
TRANSFER_UNIT = 128  # CXL 3.0 8.2.9.3.2: packages and each piece in 128-byte units
IDLE = "idle"
DEFAULT_WAIT_S = 600.0


@dataclass(frozen=True)
class LoaderState:
    """The firmware loader of one memdev: idle, preparing, transferring, programming."""

    status: str
    remaining: int
    error: str

    @property
    def busy(self) -> bool:
        """An update is under way."""
        return self.status != IDLE or self.remaining > 0


def loader_dir(fs: Sysfs, memdev: str) -> str:
    """The memdev's firmware loader, or why there is none."""
    path = f"{LOADER}/{memdev}"
    if not fs.exists(f"{path}/loading"):
        raise NotAvailableError(
            f"{memdev} has no {path}: its device has no Transfer FW command (or the kernel "
            "lacks CONFIG_FW_UPLOAD)"
        )
    return path


def loader_state(fs: Sysfs, memdev: str) -> LoaderState:
    """What the memdev's firmware loader says now."""
    path = loader_dir(fs, memdev)
    status = fs.read(f"{path}/status") or IDLE
    # the loader answers EBUSY for its error while an update runs: read it when idle
    error = (fs.read(f"{path}/error") or "") if status == IDLE else ""
    return LoaderState(status, fs.read_int(f"{path}/remaining_size") or 0, error)


def check_image(path: str) -> int:
    """The size of a firmware image that may be sent (see the module's checks)."""
    input_file(path, "firmware file")
    size = os.path.getsize(path)
    if size == 0:
        raise InvalidRequestError(f"firmware file {path} is empty")
    if size % TRANSFER_UNIT:
        raise InvalidRequestError(
            f"firmware file {path} is {size} bytes, not a whole number of 128-byte units as "
            "the CXL specification requires of a firmware package; is it the right file?"
        )
    return size


def firmware_info(fs: Sysfs, memdev: str) -> FirmwareInfo:
    """Get FW Info: slots, the active one, each slot's revision."""
    with device_ops.mailbox(fs, memdev, "reading the firmware slots") as mbox:
        return decode_fw_info(mbox.call(GET_FW_INFO, out_size=0x50))


def update_firmware(
    memdev: str, image: str, *, wait: bool = False, timeout: float = DEFAULT_WAIT_S,
    system: device_ops.Host | None = None, dry_run: bool = False,
) -> DeviceResult:  # fmt: skip
    """Send ``image`` to ``memdev``'s firmware loader; with ``wait``, return once the
    device has taken it (``timeout`` seconds at most). A failure cancels the transfer."""
    memdev, wait = device_ops.name(memdev, "memdev"), device_ops.flag(wait, "wait")
    dry_run = device_ops.flag(dry_run, "dry_run")
    fs = device_ops.host(system)
    m = device_ops.topology(fs).find_memdev(memdev)
    size = check_image(image)
    timeout = finite(timeout, "--timeout")
    path = loader_dir(fs, m.name)
    state = loader_state(fs, m.name)
    if state.busy:
        raise InvalidRequestError(
            f"{m.name} is already updating its firmware ({state.status}, {state.remaining} "
            f"bytes left); wait for it (--wait) or cancel it (pycxl memdev update-firmware "
            f"{m.name} --cancel)"
        )

    def transfer(f: Sysfs) -> Undo:
        with open(image, "rb") as src:
            data = src.read()
        f.write(f"{path}/loading", "1")
        try:
            f.write_bytes(f"{path}/data", data)
            f.write(f"{path}/loading", "0")
        except (OSError, PycxlError):
            f.write(f"{path}/loading", "-1")  # the loader's own abort
            raise
        return lambda g: g.write(f"{path}/cancel", "1")

    steps: list[Step] = [action(f"send {image} ({size} bytes) to {m.name}'s firmware loader "
                                "(cancelled on failure)", transfer)]  # fmt: skip
    if wait:
        limit = timeout
        steps.append(action(f"wait until {m.name} has taken the image (at most {limit:.0f} s)",
                            lambda f: _wait_idle(f, m.name, limit)))  # fmt: skip
    plan = Plan(f"update-firmware {m.name}", tuple(steps))
    if not dry_run:  # the slots are read from the device once done: refused before, in a tree
        device_ops.require_device(fs, m.name, "updating firmware")
    done = device_ops.run(fs, m.name, plan, dry_run=dry_run, what="updating firmware")
    return DeviceResult(m.name, plan, done, memdev=m, details=_report(fs, m.name, done))


def _wait_idle(fs: Sysfs, memdev: str, timeout: float) -> None:
    wait_until(lambda: True if not loader_state(fs, memdev).busy else None,
               what=f"{memdev}'s firmware update", timeout=timeout, live=False)  # fmt: skip
    error = loader_state(fs, memdev).error
    if error:
        raise OperationError(f"{memdev}'s firmware update failed: {error}")


def cancel_firmware_update(
    memdev: str,
    *,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Abort ``memdev``'s firmware update under way; none under way is an error (as
    ndctl)."""
    memdev, dry_run = device_ops.name(memdev, "memdev"), device_ops.flag(dry_run, "dry_run")
    fs = device_ops.host(system)
    m = device_ops.topology(fs).find_memdev(memdev)
    path = loader_dir(fs, m.name)
    if not loader_state(fs, m.name).busy:
        raise InvalidRequestError(f"{m.name} has no firmware update under way to cancel")
    step = action(f"cancel {m.name}'s firmware update", lambda f: f.write(f"{path}/cancel", "1"))
    plan = Plan(f"cancel firmware update {m.name}", (step,))
    if not dry_run:
        device_ops.require_device(fs, m.name, "cancelling a firmware update")
    done = device_ops.run(fs, m.name, plan, dry_run=dry_run, what="cancelling an update")
    return DeviceResult(m.name, plan, done, memdev=m, details=_report(fs, m.name, done))


def _report(fs: Sysfs, memdev: str, done: bool) -> dict[str, object]:
    """The loader's state and the device's slots, as ndctl's firmware JSON shows them."""
    if not done:
        return {}
    state = loader_state(fs, memdev)
    return {"loader": state, "firmware": firmware_info(fs, memdev)}
