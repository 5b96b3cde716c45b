"""One snapshot of a host's memory: CXL objects, NUMA nodes with tiers, GPUs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .cxl.topology import CxlTopology
from .gpu.devices import GpuInventory
from .sysfs import Sysfs
from .tiers import NodeTier, Target, classify_nodes, explicit_cxl_nodes, resolve

Backend = Literal["sysfs", "libcxl"]


@dataclass(frozen=True)
class System:
    cxl: CxlTopology
    nodes: tuple[NodeTier, ...]
    gpus: GpuInventory

    @property
    def absent(self) -> list[str]:
        """What this host lacks, in words, for the summary line."""
        out = []
        if not self.cxl.present:
            out.append(
                "no CXL bus (CXL drivers not loaded or no CXL hardware: "
                "modprobe cxl_acpi cxl_pci cxl_mem)"
            )
        elif not self.cxl.memdevs:
            out.append("no CXL memdevs")
        if self.gpus.absent_reason:
            out.append(self.gpus.absent_reason)
        return out

    def resolve(self, name: str, *, initiator: bool = False) -> Target:
        return resolve(name, self.nodes, self.gpus.devices, initiator=initiator)


def read_cxl(sysfs: Sysfs | None = None, backend: Backend = "sysfs") -> CxlTopology:
    if backend == "libcxl":
        from .cxl import libcxl_backend

        return libcxl_backend.read_topology(sysfs)
    from .cxl import sysfs_backend

    return sysfs_backend.read_topology(sysfs)


def snapshot(
    sysroot: str | None = None,
    *,
    backend: Backend = "sysfs",
    gpus: bool = True,
    explicit_cxl: str | None = None,
) -> System:
    """Read everything once. ``gpus=False`` skips the CUDA driver (it is slow to start)."""
    from .gpu.devices import read_gpus
    from .numa.nodes import read_nodes

    fs = Sysfs(sysroot)
    cxl = read_cxl(fs, backend)
    nodes = classify_nodes(read_nodes(fs), cxl.node_to_region(), explicit_cxl_nodes(explicit_cxl))
    inventory = read_gpus(fs) if gpus else GpuInventory((), None, "GPUs not queried")
    return System(cxl=cxl, nodes=tuple(nodes), gpus=inventory)
