"""libnuma, wrapped: the only module that calls it. Its syscall wrappers (set_mempolicy,
get_mempolicy, mbind, move_pages) take and return Python values here, so policies and
page queries never see cffi objects; and libnuma's own view of the nodes (to check
sysfs's)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..base._lib.libs import LIBNUMA
from ..base.errors import InvalidRequestError, NotAvailableError, OperationError

# Bits in the node masks pycxl passes (the kernel's MAX_NUMNODES is at most 1024).
MASK_BITS = 1024


def _mask(ffi: Any, nodes: Sequence[int]) -> Any:
    words = ffi.new("unsigned long[]", MASK_BITS // 64)
    for n in nodes:
        if not 0 <= n < MASK_BITS:
            raise InvalidRequestError(f"node {n} is out of range")
        words[n // 64] |= 1 << (n % 64)
    return words


def set_mempolicy(mode: int, nodes: Sequence[int]) -> int:
    """Set the calling thread's policy; 0, or the errno of the kernel's refusal."""
    ffi, lib = LIBNUMA.load()
    mask = _mask(ffi, nodes) if nodes else ffi.NULL
    rc = lib.set_mempolicy(mode, mask, MASK_BITS + 1 if nodes else 0)
    return int(ffi.errno) if rc != 0 else 0


def get_mempolicy() -> tuple[int, tuple[int, ...]]:
    """The calling thread's (mode with its flag bits, nodes)."""
    ffi, lib = LIBNUMA.load()
    mode = ffi.new("int *")
    words = ffi.new("unsigned long[]", MASK_BITS // 64)
    if lib.get_mempolicy(mode, words, MASK_BITS + 1, ffi.NULL, 0) != 0:
        raise OperationError(f"get_mempolicy failed: {os.strerror(ffi.errno)}")
    nodes = tuple(i for i in range(MASK_BITS) if words[i // 64] >> (i % 64) & 1)
    return int(mode[0]), nodes


def mbind(address: int, length: int, mode: int, nodes: Sequence[int], flags: int) -> int:
    """Apply a policy to [address, address+length); 0, or the errno of the refusal."""
    ffi, lib = LIBNUMA.load()
    mask = _mask(ffi, nodes) if nodes else ffi.NULL
    rc = lib.mbind(ffi.cast("void *", address), length, mode, mask,
                   MASK_BITS + 1 if nodes else 0, flags)  # fmt: skip
    return int(ffi.errno) if rc != 0 else 0


def move_pages(pages: Sequence[int], node: int | None, flags: int) -> list[int]:
    """Each page's node (``node`` None: where it is; else move it to ``node`` and say
    where it went), or a negative errno for that page."""
    ffi, lib = LIBNUMA.load()
    n = len(pages)
    addrs = ffi.new("void *[]", [ffi.cast("void *", p) for p in pages])
    status = ffi.new("int[]", n)
    nodes = ffi.new("int[]", [node] * n) if node is not None else ffi.NULL
    if lib.move_pages(0, n, addrs, nodes, status, flags) < 0:
        raise OperationError(f"move_pages failed: {os.strerror(ffi.errno)}")
    return list(status)


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
