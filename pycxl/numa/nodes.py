"""NUMA nodes as the kernel reports them in /sys/devices/system/node."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..base.sysfs import Sysfs
from .access import AccessFigures, cpu_figures, read_node_access

NODE_DIR = "/sys/devices/system/node"
_MEMINFO_RE = re.compile(r"^Node\s+\d+\s+(\w+):\s+(\d+)(?:\s+kB)?$")


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its CPUs, memory and distances to the other online nodes."""

    id: int
    cpus: tuple[int, ...]
    mem_total: int  # bytes
    mem_free: int  # bytes
    # free plus what the kernel can reclaim without swapping (clean page cache, slab):
    # the per-node counterpart of MemAvailable, for "does this fit" checks
    mem_available: int = 0
    distances: dict[int, int] = field(default_factory=dict, hash=False)
    # what the platform advertises for reaching it (ACPI HMAT; CDAT for CXL), by class
    access: tuple[AccessFigures, ...] = ()

    @property
    def advertised(self) -> AccessFigures | None:
        """The advertised figures for CPUs (access class 1, else 0); None: none."""
        return cpu_figures(self.access)

    @property
    def cpuless(self) -> bool:
        """Whether the node has no CPUs (a memory-only node, such as CXL)."""
        return not self.cpus

    @property
    def has_memory(self) -> bool:
        """Whether the node has memory online."""
        return self.mem_total > 0


def read_nodes(sysfs: Sysfs | None = None) -> list[NumaNode]:
    """Online nodes in id order. A kernel without NUMA shows one node, node 0."""
    fs = sysfs or Sysfs()
    ids = fs.read_cpulist(f"{NODE_DIR}/online")
    if ids is None:
        return []
    nodes = []
    for nid in ids:
        base = f"{NODE_DIR}/node{nid}"
        meminfo = _meminfo(fs, f"{base}/meminfo")
        dist = fs.read_int_list(f"{base}/distance") or ()
        nodes.append(
            NumaNode(
                id=nid,
                cpus=fs.read_cpulist(f"{base}/cpulist") or (),
                mem_total=meminfo.get("MemTotal", 0) * 1024,
                mem_free=meminfo.get("MemFree", 0) * 1024,
                mem_available=_available(meminfo) * 1024,
                # The kernel prints distances to every online node, in id order.
                distances=dict(zip(ids, dist, strict=False)),
                access=read_node_access(fs, base),
            )
        )
    return nodes


def _meminfo(fs: Sysfs, rel: str) -> dict[str, int]:
    out = {}
    for line in fs.iter_lines(rel):
        m = _MEMINFO_RE.match(line.strip())
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def _available(meminfo: dict[str, int]) -> int:
    reclaimable = meminfo.get("FilePages", 0) - meminfo.get("Shmem", 0)
    return meminfo.get("MemFree", 0) + max(0, reclaimable) + meminfo.get("SReclaimable", 0)
