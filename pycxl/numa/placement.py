"""Putting memory on a tier: target names to nodes, buffers placed under a policy.

>>> from pycxl.numa import placement
>>> buf = placement.allocate(64 << 20, "cxl0")        # bound to the first CXL node
>>> a = buf.array("float64")                           # numpy view, no copy
>>> placement.pages_by_node(a)                         # {1: 16384}
>>> buf.migrate("dram0")
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from ..errors import InvalidRequestError, OperationError
from ..numa.nodes import NumaNode, read_nodes
from ..sysfs import Sysfs
from . import pages
from .policy import Mode, Policy, bind_range

if TYPE_CHECKING:
    import numpy as np

TargetLike = str | int
# auto: whatever the system's THP setting gives; none: base pages only (MADV_NOHUGEPAGE);
# thp: transparent huge pages (MADV_HUGEPAGE); hugetlb: reserved huge pages (MAP_HUGETLB).
HugePages = Literal["auto", "none", "thp", "hugetlb"]
HUGE_2M = 2 << 20


def resolve_nodes(
    targets: TargetLike | Sequence[TargetLike], sysroot: str | None = None
) -> list[int]:
    """Target names ('dram0', 'cxl0', 'node3', '3') or node ids -> node ids with memory."""
    from ..system import snapshot

    items = [targets] if isinstance(targets, str | int) else list(targets)
    names = [t for i in items for t in (str(i).split(",") if isinstance(i, str) else [i])]
    system = snapshot(sysroot, gpus=False)
    nodes = {n.node.id: n.node for n in system.nodes}
    out = []
    for name in names:
        t = system.resolve(f"node{name}" if isinstance(name, int) else name.strip())
        if t.kind != "node" or t.node is None:
            raise InvalidRequestError(f"'{name}' is not host memory (a GPU's HBM is not a node)")
        node = nodes[t.node]
        if not node.has_memory:
            raise InvalidRequestError(
                f"{name} (node {node.id}) has no memory online; online it first "
                "(pycxl region enable REGION)"
            )
        out.append(node.id)
    return out


def check_room(size: int, node_ids: Sequence[int], sysroot: str | None = None) -> None:
    """Refuse sizes the nodes cannot hold (their free memory, together)."""
    nodes: dict[int, NumaNode] = {n.id: n for n in read_nodes(Sysfs(sysroot))}
    free = sum(nodes[n].mem_available for n in node_ids if n in nodes)
    if size > free:
        from ..units import format_size

        raise InvalidRequestError(
            f"{format_size(size)} does not fit: node(s) {','.join(map(str, node_ids))} have "
            f"{format_size(free)} available"
        )


class NumaBuffer:
    """Anonymous memory whose pages follow a policy; freed when closed or collected."""

    def __init__(self, size: int, policy: Policy, *, huge: HugePages = "auto",
                 populate: bool = True) -> None:  # fmt: skip
        if size <= 0:
            raise InvalidRequestError(f"buffer size must be positive, not {size}")
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
            ctypes.memset(self.address, 0, self.size)  # first touch, under the policy

    def span(self) -> tuple[int, int]:
        return self.address, self.size

    def memoryview(self) -> memoryview:
        return memoryview(self._map)

    def array(self, dtype: Any = "uint8", shape: int | tuple[int, ...] | None = None) -> np.ndarray:
        """A numpy view of the buffer (no copy); it keeps the buffer alive."""
        import numpy as np

        arr = np.frombuffer(self._map, dtype=dtype)
        return arr.reshape(shape) if shape is not None else arr

    def pages_by_node(self) -> dict[int, int]:
        return pages.pages_by_node(self)

    def migrate(
        self, target: TargetLike | Sequence[TargetLike], sysroot: str | None = None
    ) -> dict[int, int]:
        """Move the pages to the target's node(s), and make later faults follow."""
        nodes = resolve_nodes(target, sysroot)
        check_room(self.size, nodes, sysroot)
        self.policy = Policy.bind(*nodes)
        bind_range(self.address, self.size, self.policy, move=True)
        return self.pages_by_node()

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:
            raise OperationError(
                "the buffer is still used by arrays or memoryviews; drop them first"
            ) from None

    def __enter__(self) -> NumaBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self.size


def allocate(
    size: int,
    target: TargetLike | Sequence[TargetLike] | None = None,
    *,
    policy: Policy | None = None,
    huge: HugePages = "auto",
    populate: bool = True,
    sysroot: str | None = None,
) -> NumaBuffer:
    """A buffer of ``size`` bytes bound to ``target`` (or under ``policy``), checked
    against the nodes' free memory before anything is allocated."""
    if (target is None) == (policy is None):
        raise InvalidRequestError("give a target or a policy (one of them)")
    if policy is None:
        assert target is not None
        policy = Policy.bind(*resolve_nodes(target, sysroot))
    if policy.nodes:
        check_room(size, policy.nodes, sysroot)
    return NumaBuffer(size, policy, huge=huge, populate=populate)


def pages_by_node(obj: Any) -> dict[int, int]:
    """Pages per node of a NumaBuffer, numpy array or other buffer."""
    return pages.pages_by_node(obj)


def migrate(obj: Any, target: TargetLike, sysroot: str | None = None) -> dict[int, int]:
    """Move the pages of any buffer or numpy array to a target's node."""
    (node,) = resolve_nodes(target, sysroot)
    _, length = pages.buffer_span(obj)
    check_room(length, [node], sysroot)
    return pages.migrate(obj, node)
