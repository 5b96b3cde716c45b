"""What every benchmark needs first: the target's node, the initiator's CPUs, sizes
from the caches, page sizes, and a pinned calling thread."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import InvalidRequestError, NotAvailableError
from ..gpu.devices import GpuDevice
from ..numa.placement import HugePages
from ..sysfs import Sysfs
from ..system import System, snapshot
from ..units import format_size

CACHE_DIR = "/sys/devices/system/cpu"
THP = "/sys/kernel/mm/transparent_hugepage/enabled"
PAGE_SIZES = {"4k": 4096, "2m": 2 << 20}


@dataclass(frozen=True)
class Placement:
    target: str
    node: int
    initiator: str
    cpus: tuple[int, ...]
    free: int  # target node's available memory (free + reclaimable), bytes


def place(target: str, initiator: str | None = None, system: System | None = None) -> Placement:
    """Resolve a host-memory target and its initiator (default: the CPUs of the node
    with CPUs nearest the target)."""
    s = system or snapshot(gpus=False)
    t = s.resolve(target)
    if t.kind != "node" or t.node is None:
        raise InvalidRequestError(f"'{target}' is not host memory; GPU targets need the GPU tier")
    nodes = {n.node.id: n for n in s.nodes}
    node = nodes[t.node].node
    if not node.has_memory:
        raise InvalidRequestError(f"{target} (node {node.id}) has no memory online")
    if initiator is None:
        with_cpus = [n for n in s.nodes if n.node.cpus]
        if not with_cpus:
            raise NotAvailableError("no NUMA node has CPUs")
        near = min(with_cpus, key=lambda n: (node.distances.get(n.node.id, 255), n.node.id))
        return Placement(target, node.id, near.name, near.node.cpus, node.mem_available)
    i = s.resolve(initiator, initiator=True)
    if i.kind == "cpu" and i.cpu is not None:
        cpus: tuple[int, ...] = (i.cpu,)
    elif i.kind == "node" and i.node is not None and nodes[i.node].node.cpus:
        cpus = nodes[i.node].node.cpus
    else:
        raise InvalidRequestError(f"initiator '{initiator}' has no CPUs")
    allowed = os.sched_getaffinity(0)
    cpus = tuple(c for c in cpus if c in allowed)
    if not cpus:
        raise InvalidRequestError(f"initiator '{initiator}': none of its CPUs is allowed here")
    return Placement(target, node.id, initiator, cpus, node.mem_available)


def available_gpus(system: System) -> tuple[GpuDevice, ...]:
    """Every GPU; no driver or no GPU is NotAvailableError."""
    if not system.gpus.devices:
        raise NotAvailableError(system.gpus.absent_reason or "no GPU")
    return system.gpus.devices


def resolve_gpu(gpu: str, system: System) -> GpuDevice:
    """A GPU by target name; no driver or no GPU is NotAvailableError."""
    available_gpus(system)
    g = system.resolve(gpu)
    if g.gpu is None:
        raise InvalidRequestError(f"'{gpu}' is not a GPU; name one: gpu0, gpu1...")
    return g.gpu


def huge_pages(page_bytes: int) -> HugePages:
    """How a buffer gets pages of this size: transparent huge pages above 4 KiB, and
    base pages only at 4 KiB (as multichase: where THP is "always", a 4 KiB run would
    otherwise measure huge pages)."""
    return "thp" if page_bytes > 4096 else "none"


def last_level_cache(fs: Sysfs | None = None) -> int:
    """Bytes of last-level cache on the machine (all instances), from sysfs."""
    fs = fs or Sysfs()
    seen: dict[str, int] = {}
    best_level = 0
    for cpu in fs.listdir(CACHE_DIR):
        if not (cpu.startswith("cpu") and cpu[3:].isdigit()):
            continue
        base = f"{CACHE_DIR}/{cpu}/cache"
        for idx in fs.listdir(base):
            d = f"{base}/{idx}"
            level = fs.read_int(f"{d}/level") or 0
            if (fs.read(f"{d}/type") or "") == "Instruction" or level < best_level:
                continue
            if level > best_level:
                seen, best_level = {}, level
            size = _cache_size(fs.read(f"{d}/size") or "0")
            seen[fs.read(f"{d}/shared_cpu_list") or cpu] = size
    return sum(seen.values()) or 32 << 20


def _cache_size(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(t.rstrip("KMG") or 0) * mult


def page_size(name: str, fs: Sysfs | None = None) -> int:
    if name not in PAGE_SIZES:
        raise InvalidRequestError(f"page size '{name}': use 4k or 2m")
    if name == "2m":
        fs = fs or Sysfs()
        mode = fs.read(THP) or ""
        if "[never]" in mode or not mode:
            raise NotAvailableError(
                "2 MiB pages need transparent huge pages: "
                f"echo madvise > {THP} (now: {mode or 'absent'})"
            )
    return PAGE_SIZES[name]


def check_fits(size: int, p: Placement) -> None:
    if size > p.free:
        raise InvalidRequestError(
            f"{format_size(size)} does not fit on {p.target} (node {p.node}): "
            f"{format_size(p.free)} available; pass a smaller --size"
        )


@contextmanager
def pinned(cpu: int) -> Iterator[None]:
    """Run the calling thread on one CPU, then restore its affinity."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
