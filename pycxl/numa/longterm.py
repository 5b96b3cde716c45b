"""Long-term pins, and where pages really are once something holds one.

A long-term pin (``pin_user_pages(FOLL_LONGTERM)``) is what the NVIDIA driver takes for
``cuMemHostRegister``, RDMA takes for a memory registration, and io_uring takes for fixed
buffers. The kernel never leaves such a page in ZONE_MOVABLE (or CMA): it migrates it
first, silently. So after any pin, the pages are counted again and compared with where
they were asked to be (``check_pinned``).

Without a GPU, io_uring's ``IORING_REGISTER_BUFFERS`` takes the same kind of pin from
user space: ``LongtermPin`` uses it, so a test or a user can learn, by trying, whether a
node keeps long-term-pinned pages.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..base.errors import NotAvailableError, OperationError, PlacementError
from . import pages

SYS_IO_URING_SETUP = 425  # the same number on every architecture (generic syscall table)
SYS_IO_URING_REGISTER = 427
IORING_REGISTER_BUFFERS = 0
IORING_UNREGISTER_BUFFERS = 1
PARAMS_SIZE = 120  # sizeof(struct io_uring_params)


class _Iovec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


class LongtermPin:
    """``buffer`` (NumaBuffer, numpy array, any page-aligned buffer) held by a long-term
    pin, as io_uring fixed buffers hold it, until ``close()`` or the end of a ``with``."""

    def __init__(self, buffer: Any) -> None:
        address, length = pages.buffer_span(buffer)
        libc = _libc()
        params = ctypes.create_string_buffer(PARAMS_SIZE)
        fd = libc.syscall(SYS_IO_URING_SETUP, ctypes.c_uint(1), params)
        if fd < 0:
            err = ctypes.get_errno()
            raise NotAvailableError(
                f"io_uring is not available here ({os.strerror(err)}): the kernel is built "
                "without it or it is switched off (sysctl kernel.io_uring_disabled)"
            )
        self._fd = fd
        iov = _Iovec(address, length)
        rc = libc.syscall(SYS_IO_URING_REGISTER, ctypes.c_uint(fd),
                          ctypes.c_uint(IORING_REGISTER_BUFFERS), ctypes.byref(iov),
                          ctypes.c_uint(1))  # fmt: skip
        if rc < 0:
            err = ctypes.get_errno()
            os.close(fd)
            hint = (
                "; raise the memlock limit (ulimit -l) or run as root"
                if err in (errno.ENOMEM, errno.EPERM)
                else ""
            )
            raise OperationError(
                f"the kernel refused a long-term pin of {length} bytes: {os.strerror(err)}{hint}"
            )
        self.buffer = buffer

    def close(self) -> None:
        """Release the pin (the pages may move again)."""
        if self._fd >= 0:
            _libc().syscall(SYS_IO_URING_REGISTER, ctypes.c_uint(self._fd),
                            ctypes.c_uint(IORING_UNREGISTER_BUFFERS), None,
                            ctypes.c_uint(0))  # fmt: skip
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LongtermPin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            self.close()


@dataclass(frozen=True)
class PinnedPlacement:
    """Pages per node before and after a long-term pin, and where they were meant to be."""

    expected: tuple[int, ...]  # the nodes the memory was placed on
    before: dict[int, int]
    after: dict[int, int]

    @property
    def pages(self) -> int:
        """Pages of the buffer that exist (touched)."""
        return sum(n for node, n in self.after.items() if node >= 0)

    @property
    def on_expected(self) -> int:
        """Pages on the expected nodes after the pin."""
        return sum(n for node, n in self.after.items() if node in self.expected)

    @property
    def moved_to(self) -> dict[int, int]:
        """Pages found elsewhere after the pin, by node."""
        return {n: c for n, c in self.after.items() if n >= 0 and n not in self.expected}

    @property
    def stayed(self) -> bool:
        """Every page that was on the expected nodes is still there."""
        was = sum(n for node, n in self.before.items() if node in self.expected)
        return self.on_expected >= was and not self.moved_to


def expected_nodes(buffer: Any, before: dict[int, int]) -> tuple[int, ...]:
    """Where a buffer's pages are meant to be: its bind policy's nodes (a NumaBuffer),
    else wherever they were before the pin."""
    policy = getattr(buffer, "policy", None)
    nodes = tuple(getattr(policy, "nodes", ()) or ())
    return nodes or tuple(n for n in before if n >= 0)


def check_pinned(
    placement: PinnedPlacement, what: str, *, allow_migration: bool = False
) -> PinnedPlacement:
    """``placement``, or PlacementError when the pin moved pages off their nodes."""
    if placement.stayed or allow_migration:
        return placement
    moved = sum(placement.moved_to.values())
    where = ", ".join(f"node {n}: {c}" for n, c in sorted(placement.moved_to.items()))
    nodes = ",".join(map(str, placement.expected))
    raise PlacementError(
        f"{moved} of {placement.pages} pages of {what} left node {nodes} when pinned "
        f"({where}): the kernel moves long-term-pinned pages out of ZONE_MOVABLE. Online "
        "the node's memory in the normal zone (pycxl region enable REGION --zone normal), "
        "use the region's device-dax form, or accept the move (allow_migration=True)"
    )


def pin_placement(buffer: Any, pin: Any, nodes: Sequence[int] | None = None) -> PinnedPlacement:
    """Count ``buffer``'s pages, run ``pin()`` (which pins it), count them again."""
    before = pages.pages_by_node(buffer)
    expected = tuple(nodes) if nodes else expected_nodes(buffer, before)
    pin()
    return PinnedPlacement(expected, before, pages.pages_by_node(buffer))
