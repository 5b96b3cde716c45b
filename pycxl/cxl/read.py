"""Where the kernel shows CXL and dax devices, the names it gives them, and the CXL
objects read through either backend: ``read_cxl`` is the one function code above the
backends calls, so none of it names a backend.

The backends are equals with one function set (``read_topology(sysfs)``, as psutil's
per-platform modules): ``sysfs_backend`` reads the kernel's sysfs ABI, ``libcxl_backend``
asks ndctl's libcxl; both take dax devices from ``dax.read_dax_devices``. A host with
neither a CXL bus nor a dax device reads no more, and loads no backend and no model.
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING, Literal

from ..base.errors import InvalidRequestError
from ..base.sysfs import Sysfs
from ..base.values import instance, word

if TYPE_CHECKING:
    from .topology import CxlTopology

CXL_DEVICES = "/sys/bus/cxl/devices"
DAX_DEVICES = "/sys/bus/dax/devices"
# the names the kernel gives CXL devices on the bus
PORT_NAME = re.compile(r"^(root|port|endpoint)\d+$")
DECODER_NAME = re.compile(r"^decoder\d+\.\d+$")
REGION_NAME = re.compile(r"^region\d+$")
MEMDEV_NAME = re.compile(r"^mem\d+$")

Backend = Literal["sysfs", "libcxl"]
BACKENDS: dict[str, str] = {"sysfs": "sysfs_backend", "libcxl": "libcxl_backend"}


def bus_present(sysfs: Sysfs | None = None) -> bool:
    """Whether the kernel has a CXL bus (drivers loaded), without reading any device."""
    return (sysfs or Sysfs()).is_dir(CXL_DEVICES)


def nothing_to_read(sysfs: Sysfs) -> bool:
    """No CXL bus and no dax device: the topology is empty."""
    return not bus_present(sysfs) and not sysfs.listdir(DAX_DEVICES)


def read_cxl(sysfs: Sysfs | None = None, backend: Backend = "sysfs") -> CxlTopology:
    """The CXL objects, read through the kernel's sysfs or through ndctl's libcxl."""
    module = BACKENDS[word(backend, "backend", BACKENDS)]
    if sysfs is not None:
        instance(sysfs, Sysfs, "sysfs", "a pycxl.base.sysfs.Sysfs (Sysfs(sysroot)) or None")
    fs = sysfs or Sysfs()
    if backend == "libcxl" and fs.root != "/":
        raise InvalidRequestError(
            f"backend libcxl reads this machine's kernel only and cannot read the recorded "
            f"tree {fs.root}: use backend sysfs for a tree"
        )
    if backend == "sysfs" and nothing_to_read(fs):  # most hosts: nothing to read
        from .topology import CxlTopology

        return CxlTopology(present=False)
    reader = importlib.import_module(f".{module}", __package__)
    topology: CxlTopology = reader.read_topology(fs)
    return topology


SANITIZING = "sanitize"  # what a memdev's security/state reads while one runs


def security_state(fs: Sysfs, memdev: str) -> str | None:
    """A memdev's ``security/state``: disabled, unlocked, locked, frozen, or sanitize
    while one runs (None: the device has no security interface). Read here, where every
    command that reads the CXL objects finds it (check, sanitize, wait-sanitize)."""
    return fs.read(f"{CXL_DEVICES}/{memdev}/security/state")
