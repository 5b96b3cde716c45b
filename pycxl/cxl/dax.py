"""Device-dax: a CXL region's memory as a character device (``/dev/daxX.Y``) instead of
a NUMA node, and the switch between the two modes (``daxctl reconfigure-device``).

In system-ram mode (driver ``kmem``) the memory is hot-plugged as memory blocks of a
node; in devdax mode (driver ``device_dax``) a program maps the device and gets the
memory directly, with no page allocator and no zone: its pages are ZONE_DEVICE pages,
which the kernel does not migrate, so long-term pins (GPU registration) keep them.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
from typing import TYPE_CHECKING, Any

from ..base.errors import InvalidRequestError, NeedsRootError, NotAvailableError, OperationError
from ..base.sysfs import Sysfs
from ..base.units import format_size
from ..base.values import word
from . import memory_blocks
from .model import DaxDevice
from .read import DAX_DEVICES, DECODER_NAME, REGION_NAME

if TYPE_CHECKING:
    import numpy as np

DAX_DRIVERS = "/sys/bus/dax/drivers"
DRIVER_OF_MODE = {"system-ram": "kmem", "devdax": "device_dax"}
MODE_OF_DRIVER = {driver: mode for mode, driver in DRIVER_OF_MODE.items()}


def read_dax_devices(fs: Sysfs) -> list[DaxDevice]:
    """Device-dax instances, with the CXL region that feeds each (if any), from sysfs
    (for either CXL backend: libdaxctl is not bound)."""
    out = []
    for name in fs.listdir(DAX_DEVICES):
        dev = f"{DAX_DEVICES}/{name}"
        parts = fs.realpath(dev).split("/")
        region = None
        for parent, part in itertools.pairwise(parts):
            if REGION_NAME.match(part) and DECODER_NAME.match(parent):
                region = part
        size = fs.read_int(f"{dev}/size") or 0
        resource = fs.read_int(f"{dev}/resource", root_only=True)
        driver = fs.link_target_name(f"{dev}/driver")
        mode = MODE_OF_DRIVER.get(driver or "", "unbound" if driver is None else driver)
        online = total = 0
        movable: bool | None = None
        zone = None
        if mode == "system-ram" and resource is not None:
            blocks = memory_blocks.blocks_in_range(fs, resource, size)
            total = len(blocks)
            online = sum(b.online for b in blocks)
            movable = all(b.movable for b in blocks if b.online) if online else None
            zone = memory_blocks.zone_of(blocks)
        target = fs.read_int(f"{dev}/target_node")
        out.append(
            DaxDevice(
                name=name,
                region=region,
                size=size,
                resource=resource,
                target_node=target if target is not None and target >= 0 else None,
                mode=mode,
                online_memblocks=online,
                total_memblocks=total,
                movable=movable,
                zone=zone,
                align=fs.read_int(f"{dev}/align"),
            )
        )
    return out


def check_mode(mode: str) -> str:
    """``mode`` if it is 'system-ram' or 'devdax', else InvalidRequestError."""
    return word(mode, "mode", DRIVER_OF_MODE)


def unbind(fs: Sysfs, dax: str, mode: str) -> None:
    """Release ``dax`` from the driver of ``mode``."""
    fs.write(f"{DAX_DRIVERS}/{DRIVER_OF_MODE[mode]}/unbind", dax)


def bind(fs: Sysfs, dax: str, mode: str) -> None:
    """Give ``dax`` to the driver of ``mode``, as daxctl does: name it in the driver's
    id table (the dax bus matches kmem to CXL devices on its own, device_dax only by
    id), bind, and take the name out of the table again: the table outlives the device,
    and a later device of the same name (a new region's dax0.0) would go to that driver
    instead of the one its region asks for."""
    driver = f"{DAX_DRIVERS}/{DRIVER_OF_MODE[mode]}"
    if not fs.is_dir(driver):
        module = DRIVER_OF_MODE[mode]
        raise NotAvailableError(f"the {module} driver is not loaded (modprobe {module})")
    # already in the table, or a kernel without new_id: the bind says what matters
    with contextlib.suppress(OperationError):
        fs.write(f"{driver}/new_id", dax)
    try:
        if fs.link_target_name(f"{DAX_DEVICES}/{dax}/driver") != DRIVER_OF_MODE[mode]:
            fs.write(f"{driver}/bind", dax)
    finally:
        with contextlib.suppress(OperationError):  # not in the table: nothing to undo
            fs.write(f"{driver}/remove_id", dax)


class DaxMapping:
    """A devdax device mapped into this process (``MAP_SHARED``): the region's memory,
    directly. ``array(dtype)`` is a numpy view; ``pycxl.gpu.memory.HostMemory`` can
    register it for a GPU."""

    def __init__(self, dax: DaxDevice, size: int | None = None) -> None:
        if dax.mode != "devdax":
            region = dax.region or "its region"
            raise InvalidRequestError(
                f"{dax.name} is in {dax.mode} mode: its memory is "
                + ("a NUMA node's" if dax.mode == "system-ram" else "not available")
                + f"; switch it to devdax first (pycxl region enable {region} --mode devdax)"
            )
        align = dax.align or mmap.PAGESIZE
        size = dax.size if size is None else size
        if size <= 0 or size % align:
            raise InvalidRequestError(
                f"{size} bytes is not a multiple of {dax.name}'s alignment "
                f"({format_size(align)}); map a multiple of it, at most {format_size(dax.size)}"
            )
        if size > dax.size:
            raise InvalidRequestError(
                f"{format_size(size)} is more than {dax.name} has ({format_size(dax.size)})"
            )
        path = f"/dev/{dax.name}"
        try:
            fd = os.open(path, os.O_RDWR)
        except PermissionError:
            raise NeedsRootError(f"opening {path} needs root (or a group with access)") from None
        except FileNotFoundError:
            raise NotAvailableError(f"{path} does not exist (no devtmpfs or udev?)") from None
        try:
            self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                                  prot=mmap.PROT_READ | mmap.PROT_WRITE)  # fmt: skip
        except OSError as e:
            raise OperationError(f"cannot map {path}: {e.strerror}") from e
        finally:
            os.close(fd)
        import ctypes

        view = ctypes.c_char.from_buffer(self._map)
        self.address = ctypes.addressof(view)
        del view
        self.size = size
        self.device = dax

    def __repr__(self) -> str:
        state = "closed" if self._map.closed else f"at {self.address:#x}"
        return f"DaxMapping({self.device.name}, {format_size(self.size)}, {state})"

    def span(self) -> tuple[int, int]:
        """(address, length) of the mapping."""
        return self.address, self.size

    def array(self, dtype: Any = "uint8") -> np.ndarray:
        """A numpy view of the mapping (no copy); it keeps the mapping alive."""
        import numpy as np

        return np.frombuffer(self._map, dtype=dtype)

    def close(self) -> None:
        """Unmap (drop numpy views first)."""
        try:
            self._map.close()
        except BufferError:
            raise OperationError(
                "the mapping is still used by arrays or memoryviews; drop them first"
            ) from None

    def __enter__(self) -> DaxMapping:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close()
            return
        from ..numa.placement import close_unwinding  # only here: it costs list 8 ms

        close_unwinding(self._map)
