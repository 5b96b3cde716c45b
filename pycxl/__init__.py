"""pycxl: see, configure and measure every memory tier of a GPU host.

Importing pycxl loads no shared library and no numpy; each binding loads on first use.

    >>> import pycxl
    >>> system = pycxl.snapshot()
    >>> [n.name for n in system.nodes]          # ['dram0', 'cxl0']
    >>> system.resolve("cxl0").node             # NUMA node id of the first CXL tier
    >>> pycxl.create_region(pycxl.RegionRequest(ways=2)).tier   # 'cxl0' (as root)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    CudaError,
    InvalidRequestError,
    LibraryNotFoundError,
    NeedsRootError,
    NotAvailableError,
    NotFoundError,
    OperationError,
    PycxlError,
    SysfsError,
    TestbedError,
)

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .cxl.region_layout import RegionRequest
    from .cxl.regions import (
        RegionResult,
        create_region,
        destroy_region,
        disable_region,
        enable_region,
    )
    from .system import System, read_cxl, snapshot

_LAZY = {
    "snapshot": "system",
    "read_cxl": "system",
    "System": "system",
    "RegionRequest": "cxl.region_layout",
    "RegionResult": "cxl.regions",
    "create_region": "cxl.regions",
    "destroy_region": "cxl.regions",
    "disable_region": "cxl.regions",
    "enable_region": "cxl.regions",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pycxl' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = [
    "CudaError",
    "InvalidRequestError",
    "LibraryNotFoundError",
    "NeedsRootError",
    "NotAvailableError",
    "NotFoundError",
    "OperationError",
    "PycxlError",
    "RegionRequest",
    "RegionResult",
    "SysfsError",
    "System",
    "TestbedError",
    "__version__",
    "create_region",
    "destroy_region",
    "disable_region",
    "enable_region",
    "read_cxl",
    "snapshot",
]
