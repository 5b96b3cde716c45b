"""A real Linux kernel with its real CXL drivers, under QEMU, for machines without CXL.

``run_in_guest(command, topology)`` boots it and runs a command; ``TOPOLOGIES`` are the
emulated CXL layouts. Submodules load on first use (the CLI lists topologies without
loading the harness).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runner import GuestResult, check_requirements, run_in_guest, topology
    from .topologies import DEFAULT_TOPOLOGY, TOPOLOGIES, Topology

_LAZY = {
    "GuestResult": "runner",
    "check_requirements": "runner",
    "run_in_guest": "runner",
    "topology": "runner",
    "DEFAULT_TOPOLOGY": "topologies",
    "TOPOLOGIES": "topologies",
    "Topology": "topologies",
}

__all__ = [
    "DEFAULT_TOPOLOGY",
    "TOPOLOGIES",
    "GuestResult",
    "Topology",
    "check_requirements",
    "run_in_guest",
    "topology",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pycxl.testbed' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
