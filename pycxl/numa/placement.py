"""Buffers whose pages follow a memory policy, and moving pages between nodes.

This floor takes node ids; names (``cxl0``, ``dram0``) are resolved above it
(``pycxl.allocate(size, "cxl0")`` and ``System.memory_nodes``).

>>> from pycxl.numa.placement import allocate
>>> buf = allocate(64 << 20, [1])                      # bound to node 1
>>> a = buf.array("float64")                           # numpy view, no copy
>>> buf.pages_by_node()                                # {1: 16384}
>>> buf.migrate([0])
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..base.errors import InvalidRequestError, OperationError
from ..base.sysfs import Sysfs
from ..base.units import format_size
from ..base.values import instance, size as checked_size
from . import pages
from .nodes import NumaNode, read_nodes
from .policy import Mode, Policy, bind_range

if TYPE_CHECKING:
    import numpy as np

# auto: whatever the system's THP setting gives; none: base pages only (MADV_NOHUGEPAGE);
# thp: transparent huge pages (MADV_HUGEPAGE); hugetlb: reserved huge pages (MAP_HUGETLB).
HugePages = Literal["auto", "none", "thp", "hugetlb"]
HUGE_2M = 2 << 20
FIRST_TOUCH_SHARE = 256 << 20  # no thread faults in less (its start would cost more)


def check_huge(huge: str) -> HugePages:
    """``huge`` if it is one of the HugePages choices, else InvalidRequestError."""
    choices = get_args(HugePages)
    if not isinstance(huge, str) or huge not in choices:
        raise InvalidRequestError(f"huge={huge!r}: use one of {', '.join(choices)}")
    return huge  # type: ignore[return-value]


def _first_touch(address: int, size: int, *, spread: bool) -> None:
    """Write zeros over ``size`` bytes at ``address``, faulting each page in under the
    range's policy. A large range is split over the process's CPUs where the policy,
    not the faulting thread's node, places the pages (``spread``): faults are most of a
    large buffer's making, and they run in parallel (ctypes lets go of the GIL). Every
    thread is waited for, an interrupt too, before the range may be unmapped."""
    threads = min(len(os.sched_getaffinity(0)), size // FIRST_TOUCH_SHARE) if spread else 1
    if threads <= 1:
        ctypes.memset(address, 0, size)
        return
    share = -(-size // threads // mmap.PAGESIZE) * mmap.PAGESIZE
    workers = [
        threading.Thread(target=ctypes.memset, args=(address + lo, 0, min(share, size - lo)),
                         name="pycxl-first-touch", daemon=True)
        for lo in range(0, size, share)
    ]  # fmt: skip
    for w in workers:
        w.start()
    try:
        for w in workers:
            w.join()
    finally:
        for w in workers:  # an interrupt in a join: the pages are still being written
            while w.is_alive():
                with contextlib.suppress(KeyboardInterrupt):
                    w.join()


def check_room(size: int, node_ids: Sequence[int], fs: Sysfs | None = None) -> None:
    """Refuse sizes the nodes cannot hold (their available memory, together), read
    from ``fs`` (default: this machine's tree)."""
    nodes: dict[int, NumaNode] = {n.id: n for n in read_nodes(fs or Sysfs())}
    unknown = [n for n in node_ids if n not in nodes]
    if unknown:
        raise InvalidRequestError(
            f"node(s) {','.join(map(str, unknown))} are not online; online nodes: "
            + ",".join(str(n) for n in nodes)
        )
    free = sum(nodes[n].mem_available for n in node_ids)
    if size > free:
        raise InvalidRequestError(
            f"{format_size(size)} does not fit: node(s) {','.join(map(str, node_ids))} have "
            f"{format_size(free)} available"
        )


class NumaBuffer:
    """Anonymous memory whose pages follow a policy; freed when closed or collected."""

    def __init__(self, size: int, policy: Policy, *, huge: HugePages = "auto",
                 populate: bool = True) -> None:  # fmt: skip
        size = checked_size(size, "buffer size")  # a public class: its values enter here
        instance(policy, Policy, "policy", "a pycxl.Policy, such as Policy.bind(0)")
        huge = check_huge(huge)
        align = HUGE_2M if huge in ("thp", "hugetlb") else mmap.PAGESIZE
        self.size = -(-size // align) * align
        self.policy = policy
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        if huge == "hugetlb":
            flags |= getattr(mmap, "MAP_HUGETLB", 0x40000)
        try:
            self._map = mmap.mmap(-1, self.size, flags=flags)
        except OSError as e:
            hint = (
                " (no free huge pages: echo N > /proc/sys/vm/nr_hugepages)"
                if huge == "hugetlb"
                else ""
            )
            raise OperationError(f"cannot map {self.size} bytes: {e.strerror}{hint}") from e
        view = ctypes.c_char.from_buffer(self._map)
        self.address = ctypes.addressof(view)
        del view  # keep no export open, so close() can unmap
        if huge == "thp":
            self._map.madvise(mmap.MADV_HUGEPAGE)
        elif huge == "none":  # even where THP is "always"
            self._map.madvise(mmap.MADV_NOHUGEPAGE)
        if policy.mode != Mode.DEFAULT:
            bind_range(self.address, self.size, policy)
        if populate:
            _first_touch(self.address, self.size, spread=policy.mode != Mode.DEFAULT)

    def __repr__(self) -> str:
        state = "closed" if self._map.closed else f"at {self.address:#x}"
        return f"NumaBuffer({format_size(self.size)}, {self.policy.describe()}, {state})"

    def span(self) -> tuple[int, int]:
        """(address, length) of the buffer; a closed one has none (its address is
        unmapped, and asking the kernel of it would say nothing true)."""
        if self._map.closed:
            raise InvalidRequestError("the buffer is closed: its pages are gone")
        return self.address, self.size

    def memoryview(self) -> memoryview:
        """The buffer as a writable memoryview (no copy)."""
        return memoryview(self._map)

    def array(self, dtype: Any = "uint8", shape: int | tuple[int, ...] | None = None) -> np.ndarray:
        """A numpy view of the buffer (no copy); it keeps the buffer alive."""
        import numpy as np

        arr = np.frombuffer(self._map, dtype=dtype)
        return arr.reshape(shape) if shape is not None else arr

    def pages_by_node(self) -> dict[int, int]:
        """Pages per node now (key -1: pages not yet touched)."""
        return pages.pages_by_node(self)

    def migrate(self, nodes: int | Sequence[int], fs: Sysfs | None = None) -> dict[int, int]:
        """Move the pages to ``nodes``, and make later faults follow; pages per node after."""
        ids = [nodes] if isinstance(nodes, int) else list(nodes)
        check_room(self.size, ids, fs)
        self.policy = Policy.bind(*ids)
        bind_range(self.address, self.size, self.policy, move=True)
        return self.pages_by_node()

    def close(self) -> None:
        """Unmap the buffer (drop numpy views of it first)."""
        try:
            self._map.close()
        except BufferError:
            raise OperationError(
                "the buffer is still used by arrays or memoryviews; drop them first"
            ) from None

    def __enter__(self) -> NumaBuffer:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close()
            return
        close_unwinding(self._map)

    def __len__(self) -> int:
        return self.size


def allocate(
    size: int,
    nodes: int | Sequence[int] | None = None,
    *,
    policy: Policy | None = None,
    huge: HugePages = "auto",
    populate: bool = True,
    fs: Sysfs | None = None,
) -> NumaBuffer:
    """A buffer of ``size`` bytes bound to ``nodes`` (or under ``policy``), checked
    against the nodes' available memory (read from ``fs``, default this machine's)
    before anything is allocated."""
    if (nodes is None) == (policy is None):
        raise InvalidRequestError("give nodes or a policy (one of them)")
    if policy is None:
        assert nodes is not None
        policy = Policy.bind(*([nodes] if isinstance(nodes, int) else nodes))
    if policy.nodes:
        check_room(size, policy.nodes, fs)
    return NumaBuffer(size, policy, huge=check_huge(huge), populate=populate)


def pages_by_node(obj: Any) -> dict[int, int]:
    """Pages per node of a NumaBuffer, numpy array or other buffer."""
    return pages.pages_by_node(obj)


def migrate(obj: Any, node: int, fs: Sysfs | None = None) -> dict[int, int]:
    """Move the pages of any buffer or numpy array to ``node``; pages per node after."""
    _, length = pages.buffer_span(obj)
    check_room(length, [node], fs)
    return pages.migrate(obj, node)


def close_unwinding(mapping: mmap.mmap) -> None:
    """Close ``mapping`` while an exception unwinds (Ctrl-C, a signal, an error): a numpy
    view made just before may be held by a frame the exception left, and the error of
    closing under it must not replace the exception; the mapping goes when that view
    does."""
    with contextlib.suppress(BufferError):
        mapping.close()
