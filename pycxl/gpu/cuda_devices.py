"""GPUs as the CUDA driver reports them (initialises CUDA: about a quarter of a second)."""

from __future__ import annotations

import dataclasses
import threading
import uuid as uuidlib
from typing import Any

from ..base.sysfs import Sysfs
from . import driver as drv
from .inventory import GpuDevice, GpuInventory, normalize_bus_id
from .nearest import nearest_node

_lock = threading.Lock()
_by_bus: dict[str, GpuDevice] = {}


def read_inventory(fs: Sysfs) -> GpuInventory:
    """Every CUDA device, in PCI bus order. LibraryNotFoundError without libcuda."""
    ffi, lib = drv.driver()
    version_p = ffi.new("int *")
    drv.check("cuDriverGetVersion", lib.cuDriverGetVersion(version_p))
    version = int(version_p[0])
    if drv.initialised_without_devices():
        return GpuInventory((), version, "the CUDA driver reports no GPU")
    count_p = ffi.new("int *")
    drv.check("cuDeviceGetCount", lib.cuDeviceGetCount(count_p))
    raw = [_read_device(ffi, lib, ordinal, fs) for ordinal in range(count_p[0])]
    raw.sort(key=lambda d: d.pci_bus_id)
    devices = tuple(dataclasses.replace(d, index=i) for i, d in enumerate(raw))
    return GpuInventory(devices, version, None if devices else "the CUDA driver reports no GPU")


def by_bus_id(bus_id: str, index: int, fs: Sysfs | None = None) -> GpuDevice:
    """The CUDA device at PCI address ``bus_id``, as GPU ``index`` (read once)."""
    with _lock:
        if bus_id not in _by_bus:
            ffi, lib = drv.driver()
            _by_bus[bus_id] = _read_device(ffi, lib, ordinal_of(bus_id), fs or Sysfs("/"))
    return dataclasses.replace(_by_bus[bus_id], index=index)


def ordinal_of(bus_id: str) -> int:
    """CUDA's ordinal of the GPU at ``bus_id``; CudaError when CUDA does not show it."""
    ffi, lib = drv.driver()
    dev = ffi.new("CUdevice *")
    drv.check("cuDeviceGetByPCIBusId", lib.cuDeviceGetByPCIBusId(dev, bus_id.encode()))
    count = ffi.new("int *")
    drv.check("cuDeviceGetCount", lib.cuDeviceGetCount(count))
    for ordinal in range(count[0]):
        d = ffi.new("CUdevice *")
        drv.check("cuDeviceGet", lib.cuDeviceGet(d, ordinal))
        if d[0] == dev[0]:
            return ordinal
    raise drv.error("cuDeviceGetByPCIBusId", drv.CUDA_ERROR_INVALID_DEVICE)


def _attr(ffi: Any, lib: Any, dev: int, attr: int) -> int | None:
    value = ffi.new("int *")
    if lib.cuDeviceGetAttribute(value, attr, dev) != drv.CUDA_SUCCESS:
        return None
    return int(value[0])


def _read_device(ffi: Any, lib: Any, ordinal: int, fs: Sysfs) -> GpuDevice:
    dev_p = ffi.new("CUdevice *")
    drv.check("cuDeviceGet", lib.cuDeviceGet(dev_p, ordinal))
    dev = dev_p[0]
    name = ffi.new("char[256]")
    drv.check("cuDeviceGetName", lib.cuDeviceGetName(name, 256, dev))
    uu = ffi.new("CUuuid *")
    try:
        rc = lib.cuDeviceGetUuid_v2(uu, dev)
    except AttributeError:  # drivers before CUDA 11.4
        rc = lib.cuDeviceGetUuid(uu, dev)
    drv.check("cuDeviceGetUuid", rc)
    mem = ffi.new("size_t *")
    drv.check("cuDeviceTotalMem_v2", lib.cuDeviceTotalMem_v2(mem, dev))
    bus = ffi.new("char[32]")
    drv.check("cuDeviceGetPCIBusId", lib.cuDeviceGetPCIBusId(bus, 32, dev))
    bus_id = normalize_bus_id(ffi.string(bus).decode())
    numa, source = nearest_node(fs, bus_id, lambda: _attr(ffi, lib, dev, drv.ATTR_HOST_NUMA_ID))

    def a(attr: int) -> int | None:
        return _attr(ffi, lib, dev, attr)

    def flag(attr: int) -> bool | None:
        v = a(attr)
        return None if v is None else bool(v)

    major, minor = a(drv.ATTR_COMPUTE_CAPABILITY_MAJOR), a(drv.ATTR_COMPUTE_CAPABILITY_MINOR)
    sm_count = a(drv.ATTR_MULTIPROCESSOR_COUNT)
    return GpuDevice(
        index=ordinal,
        ordinal=ordinal,
        name=ffi.string(name).decode(),
        uuid="GPU-" + str(uuidlib.UUID(bytes=bytes(ffi.buffer(uu, 16)))),
        pci_bus_id=bus_id,
        total_memory=int(mem[0]),
        sm_count=sm_count,
        compute_capability=None if major is None or minor is None else (major, minor),
        numa_node=numa,
        numa_node_source=source,
        source="cuda",
        sm_count_source="cuda" if sm_count is not None else None,
        can_map_host_memory=flag(drv.ATTR_CAN_MAP_HOST_MEMORY),
        unified_addressing=flag(drv.ATTR_UNIFIED_ADDRESSING),
        pageable_memory_access=flag(drv.ATTR_PAGEABLE_MEMORY_ACCESS),
        host_register_supported=flag(drv.ATTR_HOST_REGISTER_SUPPORTED),
        async_engines=a(drv.ATTR_ASYNC_ENGINE_COUNT),
        l2_cache=a(drv.ATTR_L2_CACHE_SIZE),
    )
