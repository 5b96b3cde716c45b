"""The conditions a measurement runs under: quick mode and default sizes, the caches a
working set must exceed, page sizes, and the calling thread pinned to one CPU.

What is measured comes resolved from above (a ``pycxl.measure.targets.Pair``: the target's
node, the initiator's CPUs or GPU); this module never sees a name.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypedDict

from ..base.errors import NotAvailableError
from ..base.sysfs import Sysfs
from ..numa.placement import HugePages

QUICK_ENV = "PYCXL_BENCH_QUICK"
CPU_DIR = "/sys/devices/system/cpu"
THP = "/sys/kernel/mm/transparent_hugepage/enabled"
PAGE_SIZES = {"4k": 4096, "2m": 2 << 20}
FALLBACK_LLC = 32 << 20  # when neither sysfs nor the C library knows the caches


def quick() -> bool:
    """``PYCXL_BENCH_QUICK=1``: small default working sets and few samples, for a first
    look at a code path or memory as slow as emulated CXL (docs/benchmarks.md). The
    figures then describe caches, not the tier; explicit sizes and counts still win."""
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def default(normal: int, quick_value: int) -> int:
    """A default size or count: ``normal``, or ``quick_value`` in quick mode."""
    return quick_value if quick() else normal


def huge_pages(page_bytes: int) -> HugePages:
    """How a buffer gets pages of this size: transparent huge pages above 4 KiB, and
    base pages only at 4 KiB (as multichase: where THP is "always", a 4 KiB run would
    otherwise measure huge pages)."""
    return "thp" if page_bytes > 4096 else "none"


def last_level_cache(fs: Sysfs | None = None) -> int:
    """Bytes of last-level cache on the machine (all instances).

    From sysfs (``cpuN/cache/indexM``: only those directories are caches; the kernel
    keeps other entries there, such as ``uevent``); else from the C library
    (``sysconf``); else 32 MiB.
    """
    fs = fs or Sysfs()
    seen: dict[str, int] = {}
    best_level = 0
    for cpu in fs.listdir(CPU_DIR):
        if not (cpu.startswith("cpu") and cpu[3:].isdecimal()):
            continue
        base = f"{CPU_DIR}/{cpu}/cache"
        for idx in fs.listdir(base):
            d = f"{base}/{idx}"
            if not (idx.startswith("index") and idx[5:].isdecimal() and fs.is_dir(d)):
                continue
            level = fs.read_int(f"{d}/level") or 0
            if (fs.read(f"{d}/type") or "") == "Instruction" or level < best_level:
                continue
            if level > best_level:
                seen, best_level = {}, level
            size = _cache_size(fs.read(f"{d}/size") or "0")
            seen[fs.read(f"{d}/shared_cpu_list") or cpu] = size
    return sum(seen.values()) or _sysconf_llc() or FALLBACK_LLC


class CacheFit(TypedDict):
    """The cache fields of a latency or bandwidth result."""

    last_level_cache: int
    fits_in_cache: bool


def cache_fit(working_set: int, cache: int | None = None) -> CacheFit:
    """A result's ``last_level_cache`` (default: the CPUs') and whether ``working_set``
    bytes fit in it, in which case the figure describes the cache, not the memory."""
    size = last_level_cache() if cache is None else cache
    return {"last_level_cache": size, "fits_in_cache": working_set <= size}


def _sysconf_llc() -> int:
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        if name in os.sysconf_names:
            try:
                size = os.sysconf(name)
            except (OSError, ValueError):
                continue
            if size > 0:
                return size
    return 0


def _cache_size(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    digits = t.rstrip("KMG")
    return int(digits) * mult if digits.isdecimal() else 0


def page_size(name: str, fs: Sysfs | None = None) -> int:
    """Bytes of a page size name ('4k', '2m', checked by ``values.page_size`` where it
    came in); 2 MiB needs transparent huge pages."""
    if name == "2m":
        fs = fs or Sysfs()
        mode = fs.read(THP) or ""
        if "[never]" in mode or not mode:
            raise NotAvailableError(
                "2 MiB pages need transparent huge pages: "
                f"echo madvise > {THP} (now: {mode or 'absent'})"
            )
    return PAGE_SIZES[name]


def smt_siblings(cpu: int, fs: Sysfs | None = None) -> tuple[int, ...]:
    """The CPUs that share ``cpu``'s core (itself included), from sysfs."""
    fs = fs or Sysfs()
    return fs.read_cpulist(f"{CPU_DIR}/cpu{cpu}/topology/thread_siblings_list") or (cpu,)


@contextmanager
def pinned(cpu: int) -> Iterator[None]:
    """Run the calling thread on one CPU, then restore its affinity."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
