"""A memdev's label storage area (LSA): read, written and zeroed through the mailbox
(Get LSA, Set LSA), in pieces no larger than one mailbox payload, as ndctl's
``cxl read-labels``, ``write-labels`` and ``zero-labels`` do.

A write is one plan step that reads what it will overwrite first, so a write that
fails half-way (or a later step) puts the old bytes back.
"""

from __future__ import annotations

import struct

from ..base.errors import InvalidRequestError, NotAvailableError
from ..base.plan import Plan, Undo, action
from ..base.sysfs import Sysfs
from ..base.values import count
from . import device_ops
from .device_ops import DeviceResult
from .mailbox import GET_LSA, SET_LSA, Mailbox
from .model import Memdev

GET_LSA_IN = struct.Struct("<II")  # offset, length
SET_LSA_HEADER = struct.Struct("<II")  # offset, reserved; then the data
DEFAULT_PAYLOAD = 256  # the smallest mailbox payload the specification allows


def nvdimm_holder(fs: Sysfs, memdev: str) -> str | None:
    """The memdev's nvdimm (pmemN) while the cxl_nvdimm driver has it: the kernel keeps
    Set LSA to itself then."""
    base = f"{device_ops.CXL_DEVICES}/{memdev}"
    for entry in fs.listdir(base):
        if (
            entry.startswith("pmem")
            and entry[4:].isdecimal()
            and fs.exists(f"{base}/{entry}/driver")
        ):
            return entry
    return None


def label_window(memdev: Memdev, size: int | None, offset: int) -> tuple[int, int]:
    """(offset, size) of a request, checked against the memdev's label area: ``size``
    None means to the end of it."""
    total = memdev.label_storage_size
    if not total:
        raise NotAvailableError(
            f"{memdev.name} has no label storage area (label_storage_size is 0 or absent): "
            "only devices with persistent capacity have one"
        )
    offset = count(offset, "--offset", minimum=0)
    if offset >= total:
        raise InvalidRequestError(
            f"offset {offset} is beyond {memdev.name}'s label area of {total} bytes; give "
            f"an offset below {total}"
        )
    size = total - offset if size is None else count(size, "--size", minimum=1)
    if offset + size > total:
        raise InvalidRequestError(
            f"{size} bytes at offset {offset} run past {memdev.name}'s label area of {total} "
            f"bytes; give at most {total - offset}"
        )
    return offset, size


def _chunk(memdev: Memdev) -> int:
    """Bytes of label data one Set LSA carries (the payload less its header)."""
    return (memdev.payload_max or DEFAULT_PAYLOAD) - SET_LSA_HEADER.size


def _read(mbox: Mailbox, memdev: Memdev, offset: int, size: int) -> bytes:
    out = bytearray()
    step = _chunk(memdev)
    for at in range(offset, offset + size, step):
        n = min(step, offset + size - at)
        out += mbox.call(GET_LSA, GET_LSA_IN.pack(at, n), n)
    return bytes(out)


def _write(mbox: Mailbox, memdev: Memdev, offset: int, data: bytes) -> None:
    step = _chunk(memdev)
    for i in range(0, len(data), step):
        mbox.call(SET_LSA, SET_LSA_HEADER.pack(offset + i, 0) + data[i : i + step])


def read_labels(
    memdev: str,
    *,
    size: int | None = None,
    offset: int = 0,
    system: device_ops.Host | None = None,
) -> bytes:
    """``size`` bytes (default: to the end) of ``memdev``'s label area from ``offset``."""
    memdev = device_ops.name(memdev, "memdev")
    fs = device_ops.host(system)
    m = device_ops.topology(fs).find_memdev(memdev)
    offset, size = label_window(m, size, offset)
    device_ops.require_root(fs, "reading the label area (a mailbox command)")
    with device_ops.mailbox(fs, m.name, "reading the label area") as mbox:
        return _read(mbox, m, offset, size)


def write_labels(
    memdev: str,
    data: bytes,
    *,
    offset: int = 0,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Write ``data`` into ``memdev``'s label area at ``offset``; the bytes it replaces
    are read first and put back if the write fails."""
    memdev = device_ops.name(memdev, "memdev")
    dry_run = device_ops.flag(dry_run, "dry_run")
    if not isinstance(data, bytes | bytearray):
        raise InvalidRequestError(f"label data {type(data).__name__}: give bytes")
    if not data:
        raise InvalidRequestError("the label data is empty: give a file with the bytes to write")
    return _store(memdev, bytes(data), offset, device_ops.host(system), dry_run, "write")


def zero_labels(
    memdev: str,
    *,
    size: int | None = None,
    offset: int = 0,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Zero ``size`` bytes (default: to the end) of ``memdev``'s label area."""
    memdev = device_ops.name(memdev, "memdev")
    dry_run = device_ops.flag(dry_run, "dry_run")
    fs = device_ops.host(system)
    m = device_ops.topology(fs).find_memdev(memdev)
    offset, size = label_window(m, size, offset)
    return _store(memdev, bytes(size), offset, fs, dry_run, "zero")


def _store(memdev: str, data: bytes, offset: int, fs: Sysfs, dry_run: bool,
           verb: str) -> DeviceResult:  # fmt: skip
    m = device_ops.topology(fs).find_memdev(memdev)
    offset, size = label_window(m, len(data), offset)
    pieces = -(-size // _chunk(m))
    asking = f"{'zeroing' if verb == 'zero' else 'writing'} the label area"
    if not dry_run:
        device_ops.require_device(fs, m.name, asking)  # a tree: said before anything else
        device_ops.require_root(fs, f"{verb} of the label area")
        holder = nvdimm_holder(fs, m.name)
        if holder is not None:  # the kernel would refuse Set LSA (EBUSY): say why first
            raise InvalidRequestError(
                f"{m.name}'s label area is held by its nvdimm {holder} (driver cxl_nvdimm, "
                f"which caches the labels); take {m.name} out of service first (pycxl memdev "
                f"disable {m.name}: its nvdimm goes with it), then bring it back (pycxl "
                f"memdev enable {m.name}: the labels are read afresh)"
            )
        with device_ops.mailbox(fs, m.name, asking) as mbox:  # refused before anything is read
            mbox.check_allowed(SET_LSA)

    def store(_: Sysfs) -> Undo:
        with device_ops.mailbox(fs, m.name, asking) as mbox:
            old = _read(mbox, m, offset, size)
            try:
                _write(mbox, m, offset, data)
            except Exception:
                _write(mbox, m, offset, old)
                raise

        def restore(_: Sysfs) -> None:
            with device_ops.mailbox(fs, m.name, asking) as mb:
                _write(mb, m, offset, old)

        return restore

    what = "zero" if verb == "zero" else "write"
    step = action(f"{what} {size} bytes of {m.name}'s label area at offset {offset} "
                  f"({pieces} Set LSA command{'s' if pieces > 1 else ''}; the old bytes "
                  "are read first and restored on failure)", store)  # fmt: skip
    plan = Plan(f"{verb}-labels {m.name}", (step,))
    done = device_ops.run(fs, m.name, plan, dry_run=dry_run, what=f"{verb} of the label area")
    return DeviceResult(m.name, plan, done, memdev=m, details={"offset": offset, "size": size})
