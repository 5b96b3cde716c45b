"""Where pages are: per page (move_pages as a query) and per process (numa_maps); and
moving pages of a buffer to another node."""

from __future__ import annotations

import errno
import mmap
import os
import re
from collections import Counter
from typing import Any

from ..base.errors import InvalidRequestError, NotFoundError, OperationError, SysfsError
from ..base.sysfs import Sysfs
from ..base.values import pid as check_pid
from . import libnuma
from .policy import MPOL_MF_MOVE

PAGE = mmap.PAGESIZE
NOT_PRESENT = -1  # key for pages not yet touched (move_pages says -ENOENT)


def tensor_span(obj: Any, device: str) -> tuple[int, int] | None:
    """(address, bytes) of a contiguous torch tensor on ``device`` ('cpu', 'cuda');
    None for what is not a torch tensor (any dtype, bf16 too, unlike the array
    interfaces)."""
    if not (hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous")):
        return None
    if obj.device.type != device:
        raise InvalidRequestError(f"expected memory on {device}, got a tensor on {obj.device}")
    if not obj.is_contiguous():
        raise InvalidRequestError("the tensor is not contiguous; pass .contiguous()")
    return int(obj.data_ptr()), int(obj.numel() * obj.element_size())


def buffer_span(obj: Any) -> tuple[int, int]:
    """(address, length) of a buffer, numpy array, NumaBuffer or CPU torch tensor;
    contiguous only."""
    span = getattr(obj, "span", None)
    if callable(span):
        return span()  # type: ignore[no-any-return]
    tensor = tensor_span(obj, "cpu")
    if tensor is not None:
        return tensor
    import numpy as np

    try:
        arr = obj if isinstance(obj, np.ndarray) else np.frombuffer(obj, dtype=np.uint8)
    except (TypeError, ValueError):
        raise InvalidRequestError(
            f"{type(obj).__name__} {obj!r:.40}: not a buffer; give a NumaBuffer, a numpy "
            "array or another object with the buffer protocol (bytearray, mmap)"
        ) from None
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        raise InvalidRequestError("the array is not contiguous; pass its base or a copy")
    return int(arr.__array_interface__["data"][0]), int(arr.nbytes)


def _pages(address: int, length: int) -> list[int]:
    first = address - address % PAGE
    return list(range(first, address + length, PAGE))


def _move_pages(pages: list[int], node: int | None) -> list[int]:
    return libnuma.move_pages(pages, node, MPOL_MF_MOVE if node is not None else 0)


def page_nodes(obj: Any) -> list[int]:
    """The node of each page of ``obj`` (NOT_PRESENT for pages never touched)."""
    return _span_nodes(*buffer_span(obj))


def _span_nodes(address: int, length: int) -> list[int]:
    return [s if s >= 0 else NOT_PRESENT for s in _move_pages(_pages(address, length), None)]


def span_by_node(address: int, length: int) -> dict[int, int]:
    """Pages of [address, address + length) per node; NOT_PRESENT counts untouched ones."""
    return dict(sorted(Counter(_span_nodes(address, length)).items()))


def pages_by_node(obj: Any) -> dict[int, int]:
    """Pages of ``obj`` per node; key NOT_PRESENT (-1) counts untouched pages."""
    return dict(sorted(Counter(page_nodes(obj)).items()))


def migrate(obj: Any, node: int) -> dict[int, int]:
    """Move every page of ``obj`` to ``node``; returns pages per node afterwards.
    Pages shared with other processes, or pinned, stay where they are (counted)."""
    address, length = buffer_span(obj)
    status = _move_pages(_pages(address, length), node)
    failed = [s for s in status if s < 0 and s != -2]  # -ENOENT: not present, fine
    if failed and len(failed) == len(status):
        raise OperationError(f"no page could be moved to node {node}: {os.strerror(-failed[0])}")
    return pages_by_node(obj)


_NUMA_MAPS_NODE = re.compile(r"\bN(\d+)=(\d+)")
_PAGE_KB = re.compile(r"\bkernelpagesize_kB=(\d+)")


def process_usage(pid: int, fs: Sysfs | None = None) -> dict[int, int]:
    """Bytes of a process's resident memory per node, from /proc/PID/numa_maps. Another
    user's process needs root (NeedsRootError); one the kernel hides even from root is
    an OperationError saying why."""
    return {node: resident for node, (resident, _) in process_memory(pid, fs).items()}


def process_memory(pid: int, fs: Sysfs | None = None) -> dict[int, tuple[int, int]]:
    """Per node, bytes of a process's resident memory and of its anonymous memory (the
    mappings of no file: heap, stacks, anonymous mmaps), from /proc/PID/numa_maps; the
    errors of ``process_usage``."""
    pid = check_pid(pid)
    fs = fs or Sysfs()
    path = f"/proc/{pid}/numa_maps"
    if not fs.exists(f"/proc/{pid}"):
        raise NotFoundError("process", str(pid), hint=f"no process has PID {pid} (ps -p {pid})")
    try:
        lines = list(fs.iter_lines(path))
    except SysfsError as e:
        if e.errno != errno.EACCES:
            raise
        raise OperationError(
            f"process {pid}: the kernel refuses its numa_maps even to root (ptrace access "
            "is denied: a process that is not dumpable, or one outside this container)"
        ) from None
    resident: Counter[int] = Counter()
    anonymous: Counter[int] = Counter()
    for line in lines:
        kb = _PAGE_KB.search(line)
        page = int(kb.group(1)) * 1024 if kb else PAGE
        anon = " file=" not in line
        for node, pages in _NUMA_MAPS_NODE.findall(line):
            resident[int(node)] += int(pages) * page
            if anon:
                anonymous[int(node)] += int(pages) * page
    return {n: (resident[n], anonymous[n]) for n in sorted(resident)}
