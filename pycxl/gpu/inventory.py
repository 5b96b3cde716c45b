"""The GPU model: one GPU as CUDA shows it (``GpuDevice``) and the set of them
(``GpuInventory``), whichever source read them (``devices.read_gpus`` decides)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GpuSource = Literal["auto", "nvml", "files", "cuda"]


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as CUDA shows it. ``index`` orders GPUs by PCI bus id (target name
    gpu<index>). A fact its source cannot give is None (see ``source``)."""

    index: int
    ordinal: int | None  # CUDA's device ordinal; None where only CUDA could say
    name: str
    uuid: str
    pci_bus_id: str  # 'dddd:bb:dd.f', lower case
    total_memory: int | None  # bytes, as cuDeviceTotalMem counts them
    sm_count: int | None
    compute_capability: tuple[int, int] | None
    numa_node: int | None  # nearest host node
    numa_node_source: str  # 'driver', 'sysfs', 'only-cpu-node' or 'none' (see nearest.py)
    source: str  # where the facts came from: 'nvml', 'procfs' or 'cuda'
    sm_count_source: str | None = None  # 'cuda', or 'nvml-cores' (cores / FP32 lanes per SM)
    # only the CUDA driver knows these: None unless it was asked (source 'cuda')
    can_map_host_memory: bool | None = None
    unified_addressing: bool | None = None
    pageable_memory_access: bool | None = None  # also NVML's addressing mode (HMM or ATS)
    host_register_supported: bool | None = None
    async_engines: int | None = None
    l2_cache: int | None = None  # bytes

    @property
    def target_name(self) -> str:
        """The GPU's tier name: gpu0, gpu1... in PCI bus order."""
        return f"gpu{self.index}"

    @property
    def cc_text(self) -> str | None:
        """The compute capability as CUDA writes it ('9.0'); None when unknown."""
        cc = self.compute_capability
        return None if cc is None else f"{cc[0]}.{cc[1]}"


@dataclass(frozen=True)
class GpuInventory:
    """The GPUs, or why there are none (``absent_reason``)."""

    devices: tuple[GpuDevice, ...]
    # the CUDA version the driver supports (13000: 13.0); None where neither NVML nor
    # the CUDA driver was asked (the driver's files do not say it)
    driver_version: int | None
    absent_reason: str | None


def normalize_bus_id(bus_id: str) -> str:
    """'00000000:19:00.0' or '0000:19:00.0' -> '0000:19:00.0' (sysfs form)."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)
