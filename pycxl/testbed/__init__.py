"""A real Linux kernel with its real CXL drivers, under QEMU, for machines without CXL."""

from .runner import GuestResult, check_requirements, run_in_guest, topology
from .topologies import DEFAULT_TOPOLOGY, TOPOLOGIES, Topology

__all__ = [
    "DEFAULT_TOPOLOGY",
    "TOPOLOGIES",
    "GuestResult",
    "Topology",
    "check_requirements",
    "run_in_guest",
    "topology",
]
