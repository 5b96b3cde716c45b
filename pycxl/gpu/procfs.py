"""GPUs from the NVIDIA kernel driver's files (/proc/driver/nvidia/gpus/<bus>/information):
model, UUID and bus address of each GPU the driver holds, with no library at all.

The files say nothing of memory, SMs or compute capability: those stay unknown (None).
This is what a recorded tree shows, and what a host shows whose NVML is not installed.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..base.sysfs import Sysfs
from .inventory import GpuDevice, GpuInventory, normalize_bus_id
from .nearest import nearest_node
from .nvml_session import GPUS_DIR
from .visible import select_visible

__all__ = ["GPUS_DIR", "information", "read_inventory"]


def information(fs: Sysfs, bus: str) -> dict[str, str]:
    """The 'Key: value' lines of one GPU's information file."""
    out = {}
    for line in fs.iter_lines(f"{GPUS_DIR}/{bus}/information"):
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def read_inventory(fs: Sysfs, environ: Mapping[str, str]) -> GpuInventory | None:
    """The GPUs the driver's files list, those CUDA would show this process; None when the
    driver lists none (not loaded, or no GPU)."""
    found = []
    for bus in fs.listdir(GPUS_DIR):
        info = information(fs, bus)
        if info.get("GPU Excluded", "No") != "No":
            continue  # excluded from use by the driver (NVreg_ExcludedGpus)
        if "GPU UUID" not in info or "Model" not in info:
            continue  # not a GPU the driver has brought up
        bus_id = normalize_bus_id(info.get("Bus Location", bus))
        node, source = nearest_node(fs, bus_id)
        found.append(
            GpuDevice(
                index=0,
                ordinal=None,
                name=info["Model"],
                uuid=info["GPU UUID"],
                pci_bus_id=bus_id,
                total_memory=None,
                sm_count=None,
                compute_capability=None,
                numa_node=node,
                numa_node_source=source,
                source="procfs",
            )
        )
    if not found:
        return None
    devices = select_visible(found, environ)
    return GpuInventory(devices, None, None if devices else "CUDA_VISIBLE_DEVICES hides every GPU")
