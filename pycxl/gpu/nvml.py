"""GPUs through NVML (libnvidia-ml.so.1): what the driver knows of each GPU, read without
initialising CUDA (nvmlInit takes about 11 ms on an H200 host, cuInit about 225 ms)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..base._lib.loader import has_symbol
from ..base.sysfs import Sysfs
from .inventory import GpuDevice, GpuInventory, normalize_bus_id
from .nearest import nearest_node
from .nvml_session import NVML_SUCCESS, NvmlUnusable, error_text, session
from .visible import select_visible

__all__ = ["NvmlUnusable", "read_inventory", "session"]

NVML_ERROR_NO_PERMISSION = 4  # a GPU this process may not open (a cgroup's device list)
NVML_DEVICE_MIG_ENABLE = 1
NVML_MEMORY_V2 = 40 | 2 << 24  # sizeof(nvmlMemory_v2_t) | version 2 << 24
NVML_ADDRESSING_MODE_V1 = 8 | 1 << 24
NVML_ADDRESSING_MODE_NONE = 0  # neither HMM nor ATS: the GPU cannot read pageable memory
NVML_AFFINITY_SCOPE_NODE = 0
NODE_MASK_WORDS = 16  # 1024 NUMA nodes
TEXT = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE

# FP32 lanes per SM by compute capability: the CUDA C++ Programming Guide's table of
# arithmetic throughput (32-bit add, multiply, multiply-add per clock per SM). NVML counts
# a GPU's cores (nvmlDeviceGetNumGpuCores) as SMs times these lanes; a capability not in
# the table leaves the SM count unknown rather than guessed.
FP32_LANES_PER_SM = {
    (5, 0): 128, (5, 2): 128, (5, 3): 128,
    (6, 0): 64, (6, 1): 128, (6, 2): 128,
    (7, 0): 64, (7, 2): 64, (7, 5): 64,
    (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128,
    (9, 0): 128, (10, 0): 128, (12, 0): 128,
}  # fmt: skip


def read_inventory(fs: Sysfs, environ: Mapping[str, str]) -> GpuInventory:
    """The GPUs CUDA would show this process, from NVML. NvmlUnusable when NVML cannot
    answer; visible.Undecided when only CUDA can say which GPUs it shows."""
    with session() as (ffi, lib):
        # the CUDA version the driver supports: about 0.05 ms, no CUDA context
        v = ffi.new("int *")
        version = int(v[0]) if lib.nvmlSystemGetCudaDriverVersion_v2(v) == NVML_SUCCESS else None
        count = ffi.new("unsigned int *")
        rc = lib.nvmlDeviceGetCount_v2(count)
        if rc != NVML_SUCCESS:
            raise NvmlUnusable(f"NVML: {error_text(ffi, lib, rc)}")
        found = []
        for i in range(count[0]):
            handle = ffi.new("nvmlDevice_t *")
            rc = lib.nvmlDeviceGetHandleByIndex_v2(i, handle)
            if rc == NVML_ERROR_NO_PERMISSION:
                continue  # CUDA cannot open it either
            if rc != NVML_SUCCESS:
                raise NvmlUnusable(f"NVML device {i}: {error_text(ffi, lib, rc)}")
            found.append(_read_device(ffi, lib, handle[0], fs))
    if not found:
        return GpuInventory((), version, "the NVIDIA driver reports no GPU")
    devices = select_visible(found, environ)
    reason = None if devices else "CUDA_VISIBLE_DEVICES hides every GPU"
    return GpuInventory(devices, version, reason)


def _read_device(ffi: Any, lib: Any, dev: Any, fs: Sysfs) -> GpuDevice:
    from .visible import Undecided

    current, pending = ffi.new("unsigned int *"), ffi.new("unsigned int *")
    if (
        lib.nvmlDeviceGetMigMode(dev, current, pending) == NVML_SUCCESS
        and current[0] == NVML_DEVICE_MIG_ENABLE
    ):
        raise Undecided("a GPU is in MIG mode: CUDA shows its MIG instances")
    text = ffi.new(f"char[{TEXT}]")
    _check(ffi, lib, "nvmlDeviceGetName", lib.nvmlDeviceGetName(dev, text, TEXT))
    name = ffi.string(text).decode()
    _check(ffi, lib, "nvmlDeviceGetUUID", lib.nvmlDeviceGetUUID(dev, text, TEXT))
    uuid = ffi.string(text).decode()
    pci = ffi.new("nvmlPciInfo_t *")
    _check(ffi, lib, "nvmlDeviceGetPciInfo_v3", lib.nvmlDeviceGetPciInfo_v3(dev, pci))
    bus_id = normalize_bus_id(ffi.string(pci.busId).decode())
    major, minor = ffi.new("int *"), ffi.new("int *")
    cc = None
    if lib.nvmlDeviceGetCudaComputeCapability(dev, major, minor) == NVML_SUCCESS:
        cc = (int(major[0]), int(minor[0]))
    sm_count = _sm_count(ffi, lib, dev, cc)
    node, source = nearest_node(fs, bus_id, lambda: _affinity_node(ffi, lib, dev))
    return GpuDevice(
        index=0,
        ordinal=None,
        name=name,
        uuid=uuid,
        pci_bus_id=bus_id,
        total_memory=_total_memory(ffi, lib, dev),
        sm_count=sm_count,
        compute_capability=cc,
        numa_node=node,
        numa_node_source=source,
        source="nvml",
        sm_count_source="nvml-cores" if sm_count is not None else None,
        pageable_memory_access=_pageable_access(ffi, lib, dev),
    )


def _check(ffi: Any, lib: Any, call: str, rc: int) -> None:
    if rc != NVML_SUCCESS:
        raise NvmlUnusable(f"{call}: {error_text(ffi, lib, rc)}")


def _total_memory(ffi: Any, lib: Any, dev: Any) -> int | None:
    """Bytes as CUDA counts them (cuDeviceTotalMem): the framebuffer less what the driver
    and firmware reserve."""
    mem = ffi.new("nvmlMemory_v2_t *")
    mem.version = NVML_MEMORY_V2
    if lib.nvmlDeviceGetMemoryInfo_v2(dev, mem) != NVML_SUCCESS:
        return None
    return int(mem.total - mem.reserved)


def _sm_count(ffi: Any, lib: Any, dev: Any, cc: tuple[int, int] | None) -> int | None:
    lanes = FP32_LANES_PER_SM.get(cc) if cc else None
    if lanes is None or not has_symbol(lib, "nvmlDeviceGetNumGpuCores"):
        return None
    cores = ffi.new("unsigned int *")
    if lib.nvmlDeviceGetNumGpuCores(dev, cores) != NVML_SUCCESS:
        return None
    n, rest = divmod(int(cores[0]), lanes)
    return n if n > 0 and rest == 0 else None


def _affinity_node(ffi: Any, lib: Any, dev: Any) -> int | None:
    """The one host node NVML names nearest the GPU, or None (no answer, or several)."""
    mask = ffi.new(f"unsigned long[{NODE_MASK_WORDS}]")
    rc = lib.nvmlDeviceGetMemoryAffinity(dev, NODE_MASK_WORDS, mask, NVML_AFFINITY_SCOPE_NODE)
    if rc != NVML_SUCCESS:
        return None
    bits = ffi.sizeof("unsigned long") * 8
    words = [(w, int(mask[w])) for w in range(NODE_MASK_WORDS)]
    nodes = [w * bits + b for w, word in words if word for b in range(bits) if word >> b & 1]
    return nodes[0] if len(nodes) == 1 else None


def _pageable_access(ffi: Any, lib: Any, dev: Any) -> bool | None:
    """Whether the GPU reads pageable host memory (HMM or ATS): CUDA's
    CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS. None where the driver cannot say."""
    if not has_symbol(lib, "nvmlDeviceGetAddressingMode"):
        return None
    mode = ffi.new("nvmlDeviceAddressingMode_t *")
    mode.version = NVML_ADDRESSING_MODE_V1
    if lib.nvmlDeviceGetAddressingMode(dev, mode) != NVML_SUCCESS:
        return None
    return int(mode.value) != NVML_ADDRESSING_MODE_NONE
