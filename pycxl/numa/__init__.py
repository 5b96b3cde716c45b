"""NUMA nodes, distances and (through libnuma) memory policy."""

from .nodes import NumaNode, read_nodes

__all__ = ["NumaNode", "read_nodes"]
