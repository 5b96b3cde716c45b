"""What libnuma reports, for callers that want the library's view (and to check sysfs's)."""

from __future__ import annotations

from .._lib.libs import LIBNUMA
from ..errors import NotAvailableError


def node_sizes() -> dict[int, tuple[int, int]]:
    """Node id -> (total bytes, free bytes) for nodes that have memory, from libnuma."""
    ffi, lib = LIBNUMA.load()
    if lib.numa_available() < 0:
        raise NotAvailableError("libnuma says NUMA is not available on this kernel")
    out = {}
    free = ffi.new("long long *")
    for node in range(lib.numa_max_node() + 1):
        total = lib.numa_node_size64(node, free)
        if total > 0:
            out[node] = (int(total), int(free[0]))
    return out


def distance(a: int, b: int) -> int:
    """libnuma's distance between two nodes (0 when unknown)."""
    _, lib = LIBNUMA.load()
    return int(lib.numa_distance(a, b))
