"""The CXL objects, read through either backend: the one function code above the
backends calls (``read_cxl``), so none of it names a backend.

The backends are equals with one function set (``read_topology(sysfs)``, as psutil's
per-platform modules): ``sysfs_backend`` reads the kernel's sysfs ABI, ``libcxl_backend``
asks ndctl's libcxl; both take dax devices from ``dax.read_dax_devices``. A host with
neither a CXL bus nor a dax device loads no backend and no model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Literal

from ..sysfs import Sysfs
from ..values import word
from .paths import nothing_to_read

if TYPE_CHECKING:
    from .topology import CxlTopology

Backend = Literal["sysfs", "libcxl"]
BACKENDS: dict[str, str] = {"sysfs": "sysfs_backend", "libcxl": "libcxl_backend"}


def read_cxl(sysfs: Sysfs | None = None, backend: Backend = "sysfs") -> CxlTopology:
    """The CXL objects, read through the kernel's sysfs or through ndctl's libcxl."""
    module = BACKENDS[word(backend, "backend", BACKENDS)]
    fs = sysfs or Sysfs()
    if backend == "sysfs" and nothing_to_read(fs):  # most hosts: nothing to read
        from .topology import CxlTopology

        return CxlTopology(present=False)
    reader = importlib.import_module(f".{module}", __package__)
    topology: CxlTopology = reader.read_topology(fs)
    return topology
