"""What every CXL device operation shares: the result it returns, the checks before
any write (root, the memdev named), and running its plan (or only showing it).

The operations themselves live one area a module: ``labels``, ``binding`` (memdevs,
ports and buses enabled and disabled), ``dpa``, ``poison``, ``alerts``, ``sanitize``,
``firmware``, ``partition`` and ``protocol_errors``. Each takes the host it reads and
changes one way, ``system=``: a ``pycxl.System`` or its ``Sysfs`` (a recorded tree:
``pycxl.snapshot("path/to/tree")``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from ..base.errors import InvalidRequestError, NotAvailableError, SysfsError
from ..base.plan import Plan, StepHook, require_root
from ..base.sysfs import Sysfs
from ..base.values import ascii_digits, flag
from .mailbox import Mailbox
from .model import Memdev
from .read import CXL_DEVICES, bus_present, read_cxl
from .topology import CxlTopology

__all__ = [
    "CXL_DEVICES", "DeviceResult", "Host", "device_numbers", "flag", "host", "mailbox",
    "memdev_after", "name", "require_device", "require_root", "run", "topology",
]  # fmt: skip

DEV_CXL = "/dev/cxl"  # the memdevs' character devices (their mailboxes)


@dataclass(frozen=True)
class DeviceResult:
    """What an operation did to one object (or, in a dry run, would do): its plan, and
    the object as read back afterwards; ``details`` holds what the operation reports
    beyond the object (the decoder a DPA reservation took, a firmware slot...)."""

    target: str  # the memdev, port or bus operated on
    plan: Plan
    executed: bool
    memdev: Memdev | None = None
    details: dict[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


class HasSysfs(Protocol):
    """A host read once that holds its tree: a ``pycxl.System`` (``System.sysfs()``),
    which this floor does not import."""

    def sysfs(self) -> Sysfs:
        """The tree the host was read from."""
        ...


# what an operation is handed the host as: a System, or its Sysfs
Host: TypeAlias = "Sysfs | HasSysfs"


def host(system: Host | None) -> Sysfs:
    """The tree an operation reads and writes: ``system``'s (a ``pycxl.System`` or a
    ``Sysfs``), or this machine's."""
    if system is None:
        return Sysfs()
    if isinstance(system, Sysfs):
        return system
    if not callable(getattr(system, "sysfs", None)):
        raise InvalidRequestError(
            f"system {system!r}: give a pycxl.System (pycxl.snapshot()) or a Sysfs"
        )
    return system.sysfs()


# how each kind of object is named, for a message about a missing or empty name
NAMED = {"memdev": "mem0, 0 or a serial such as 0x51", "port": "port1 or 1",
         "bus": "root0, ACPI.CXL or ACPI0017:00", "host": "ACPI0017:00 or root0",
         "decoder": "decoder2.1 or 1", "dport": "dport0 or its PCI address"}  # fmt: skip


def name(value: object, what: str) -> str:
    """A device name as typed (mem0, 0x51, port1, root0, 0000:0c:00.0): non-empty text."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequestError(f"{what} {value!r}: give a name such as {NAMED[what]}")
    return ascii_digits(value.strip(), what)


def topology(fs: Sysfs) -> CxlTopology:
    """The CXL objects now; no CXL bus at all is said as such."""
    if not bus_present(fs):
        raise NotAvailableError(CxlTopology.NO_BUS)
    return read_cxl(fs).require()


def require_device(fs: Sysfs, memdev: str, what: str) -> None:
    """Refuse a recorded tree where ``what`` must ask ``memdev`` itself (its mailbox): a
    tree has no device to ask. Nothing under it is opened or sent an ioctl (its memdevs
    are not this machine's, and its dev/ holds whatever the tree's maker put there)."""
    if fs.root != os.sep:
        raise InvalidRequestError(
            f"{what} asks {memdev}'s mailbox, and a recorded tree ({fs.root}) has no device "
            "to ask; leave --sysroot (and PYCXL_SYSROOT) unset to ask this machine's"
        )


def mailbox(fs: Sysfs, memdev: str, what: str) -> Mailbox:
    """``memdev``'s mailbox: this machine's /dev/cxl/memN, opened once it is that memdev's
    character device (its sysfs ``dev``); a recorded tree is refused (``require_device``);
    ``what`` names what needed it."""
    require_device(fs, memdev, what)
    return Mailbox(memdev, DEV_CXL, device_numbers(fs, memdev))


def device_numbers(fs: Sysfs, memdev: str) -> tuple[int, int]:
    """``memdev``'s character device numbers (major, minor), as its sysfs ``dev`` says."""
    rel = f"{CXL_DEVICES}/{memdev}/dev"
    text = fs.read(rel)
    major, _, minor = (text or "").strip().partition(":")
    if not (major.isdigit() and minor.isdigit()):
        raise SysfsError(rel, f"expected the device numbers MAJOR:MINOR, found {text!r}")
    return int(major), int(minor)


def run(
    fs: Sysfs, target: str, plan: Plan, *, dry_run: bool, what: str,
    before_step: StepHook | None = None,
) -> bool:  # fmt: skip
    """Execute ``plan`` (needs root) unless ``dry_run``; whether it ran."""
    if dry_run:
        return False
    if len(plan):
        require_root(fs, what)
        plan.execute(fs, before_step=before_step)
    return True


def memdev_after(fs: Sysfs, name: str) -> Memdev | None:
    """The memdev as the kernel shows it now (None once it is gone)."""
    return read_cxl(fs).memdev_or_none(name)
