"""A memdev's split between volatile and persistent capacity, changed through the
mailbox (Set Partition Info), as ndctl's ``set-partition``: the request is checked
against what the device says of itself (Identify: total, volatile-only and
persistent-only capacity, partition alignment) before anything is sent.

The change takes effect at the device's next reset: the kernel refuses the
specification's 'immediate' flag from user space, so pycxl never sets it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..base.errors import InvalidRequestError
from ..base.plan import Plan, action
from ..base.sysfs import Sysfs
from ..base.values import PARTITION_MODES, PMEM, RAM, count, word
from . import device_ops
from .device_ops import DeviceResult
from .mailbox import IDENTIFY, SET_PARTITION_INFO, Mailbox

CAPACITY_UNIT = 256 << 20  # Identify and Set Partition Info count capacity in 256 MiB
# Identify (CXL 3.1 8.2.9.9.1.1): FW revision, then total, volatile-only,
# persistent-only capacity and partition alignment, each in 256 MiB units
IDENTIFY_CAPACITY = struct.Struct("<16sQQQQ")
SET_PARTITION = struct.Struct("<QB")  # volatile capacity (256 MiB units), flags


@dataclass(frozen=True)
class Partitioning:
    """What Identify says about how a device's capacity may be split (bytes)."""

    total: int
    volatile_only: int
    persistent_only: int
    alignment: int

    @property
    def partitionable(self) -> int:
        """Capacity that can go either way."""
        return self.total - self.volatile_only - self.persistent_only


def read_partitioning(mbox: Mailbox) -> Partitioning:
    """Identify's capacities of the device behind ``mbox``."""
    raw = mbox.call(IDENTIFY, out_size=0x43)
    _, total, vol, pers, align = IDENTIFY_CAPACITY.unpack_from(raw)
    return Partitioning(total * CAPACITY_UNIT, vol * CAPACITY_UNIT, pers * CAPACITY_UNIT,
                        align * CAPACITY_UNIT)  # fmt: skip


def volatile_size(name: str, p: Partitioning, mode: str, size: int | None,
                  align: bool) -> int:  # fmt: skip
    """The partitionable capacity to make volatile, from a request for ``size`` bytes
    (default: all of it) of ``mode``; checked as ndctl checks it."""
    if not p.alignment or not p.partitionable:
        raise InvalidRequestError(
            f"{name} has no capacity that can change partition: Identify says all of its "
            f"{p.total >> 20} MiB is volatile-only ({p.volatile_only >> 20} MiB) or "
            f"persistent-only ({p.persistent_only >> 20} MiB)"
        )
    if size is not None and size > p.partitionable:
        raise InvalidRequestError(f"{size >> 20} MiB exceeds the {p.partitionable >> 20} MiB "
                                  f"of {name} that can change partition")  # fmt: skip
    wanted = p.partitionable if size is None else size
    vol = wanted if mode == RAM else p.partitionable - wanted
    if vol % p.alignment:
        if not align:
            raise InvalidRequestError(
                f"{vol >> 20} MiB is not a multiple of {name}'s partition alignment "
                f"({p.alignment >> 20} MiB); pass --align to round it"
            )
        down = vol - vol % p.alignment
        vol = down if mode == PMEM else down + p.alignment
        if vol > p.partitionable:
            raise InvalidRequestError(f"aligned, the size exceeds the {p.partitionable >> 20} "
                                      f"MiB that can change partition")  # fmt: skip
    return vol


def set_partition(
    memdev: str, *, mode: str = PMEM, size: int | None = None, align: bool = False,
    system: device_ops.Host | None = None, dry_run: bool = False,
) -> DeviceResult:  # fmt: skip
    """Make ``size`` bytes (default: all that can change) of ``memdev``'s capacity
    ``mode`` (ram or pmem), from its next reset."""
    memdev, align = device_ops.name(memdev, "memdev"), device_ops.flag(align, "align")
    dry_run = device_ops.flag(dry_run, "dry_run")
    size = None if size is None else count(size, "size")
    mode = word(mode, "type", PARTITION_MODES)
    fs = device_ops.host(system)
    m = device_ops.topology(fs).find_memdev(memdev)
    device_ops.require_root(fs, "reading the device's partitioning (a mailbox command)")
    what = "setting the partition"
    with device_ops.mailbox(fs, m.name, what) as mbox:
        p = read_partitioning(mbox)
        vol = volatile_size(m.name, p, mode, size, align)
        if not dry_run:
            mbox.check_allowed(SET_PARTITION_INFO)
    payload = SET_PARTITION.pack(vol // CAPACITY_UNIT, 0)

    def send(_: Sysfs) -> None:
        with device_ops.mailbox(fs, m.name, what) as mb:
            mb.call(SET_PARTITION_INFO, payload)

    step = action(f"Set Partition Info on {m.name}: {vol >> 20} MiB volatile, "
                  f"{(p.partitionable - vol) >> 20} MiB persistent of the partitionable "
                  "capacity, from the next reset", send)  # fmt: skip
    plan = Plan(f"set-partition {m.name}", (step,))
    done = device_ops.run(fs, m.name, plan, dry_run=dry_run, what="setting the partition")
    return DeviceResult(m.name, plan, done, memdev=m,
                        details={"partitioning": p, "volatile_size": vol})  # fmt: skip
