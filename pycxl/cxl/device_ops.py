"""What every CXL device operation shares: the result it returns, the checks before
any write (root, the memdev named), and running its plan (or only showing it).

The operations themselves live one area a module: ``labels``, ``binding`` (memdevs,
ports and buses enabled and disabled), ``dpa``, ``poison``, ``alerts``, ``sanitize``,
``firmware``, ``partition`` and ``protocol_errors``. Each takes the host it reads and
changes one way, ``system=``: a ``pycxl.System`` or its ``Sysfs`` (``sysroot=``, the
earlier keyword, still opens a tree by its folder).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from ..errors import InvalidRequestError, NotAvailableError
from ..plan import Plan, StepHook, require_root
from ..sysfs import Sysfs
from .model import Memdev
from .read import CXL_DEVICES, bus_present, read_cxl
from .topology import CxlTopology

__all__ = [
    "CXL_DEVICES", "DeviceResult", "Host", "flag", "host", "memdev_after", "name",
    "require_root", "run", "topology",
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


def host(system: Host | None, sysroot: str | None) -> Sysfs:
    """The tree an operation reads and writes: ``system``'s (a ``pycxl.System`` or a
    ``Sysfs``), else ``sysroot``'s (the earlier keyword, kept: it opens the same tree);
    neither: this machine's."""
    if system is not None and sysroot is not None:
        raise InvalidRequestError("give system= or sysroot=, not both")
    if system is None:
        return Sysfs(sysroot)
    if isinstance(system, Sysfs):
        return system
    if not callable(getattr(system, "sysfs", None)):
        raise InvalidRequestError(
            f"system {system!r}: give a pycxl.System (pycxl.snapshot()) or a Sysfs"
        )
    return system.sysfs()


def name(value: object, what: str) -> str:
    """A device name as typed (mem0, 0x51, port1, root0, 0000:0c:00.0): non-empty text."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequestError(f"{what} {value!r}: give a name such as mem0 or 0x51")
    return value.strip()


def flag(value: object, what: str) -> bool:
    """A yes/no option: True or False, never a truthy stand-in."""
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{what} {value!r}: give True or False")
    return value


def topology(fs: Sysfs) -> CxlTopology:
    """The CXL objects now; no CXL bus at all is said as such."""
    if not bus_present(fs):
        raise NotAvailableError(CxlTopology.NO_BUS)
    return read_cxl(fs).require()


def mailbox_dir(fs: Sysfs) -> str:
    """Where the memdevs' character devices are, under the sysroot."""
    return fs.path(DEV_CXL)


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
