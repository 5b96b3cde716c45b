"""A real Linux kernel with its real CXL drivers, under QEMU, for machines without CXL.

``run_in_guest(command, topology)`` boots it and runs a command; ``TOPOLOGIES`` are the
emulated CXL layouts. Submodules load on first use (the CLI lists topologies without
loading the harness).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base._lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, [*__all__, *globals()])
