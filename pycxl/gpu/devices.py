"""GPUs seen through the CUDA driver, with their nearest host NUMA node."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import LibraryNotFoundError
from ..sysfs import Sysfs
from . import driver as drv


@dataclass(frozen=True)
class GpuDevice:
    """One CUDA device. ``index`` orders GPUs by PCI bus id (target name gpu<index>)."""

    index: int
    ordinal: int  # the CUDA driver's own device ordinal
    name: str
    uuid: str
    pci_bus_id: str  # 'dddd:bb:dd.f', lower case
    total_memory: int  # bytes
    sm_count: int
    compute_capability: tuple[int, int]
    numa_node: int | None  # nearest host node
    numa_node_source: str  # 'driver' (HOST_NUMA_ID), 'sysfs' (PCI numa_node) or 'none'
    can_map_host_memory: bool = False
    unified_addressing: bool = False
    pageable_memory_access: bool = False
    host_register_supported: bool = False
    async_engines: int = 0
    l2_cache: int = 0  # bytes

    @property
    def target_name(self) -> str:
        """The GPU's tier name: gpu0, gpu1... in PCI bus order."""
        return f"gpu{self.index}"


@dataclass(frozen=True)
class GpuInventory:
    """The GPUs, or why there are none (``absent_reason``)."""

    devices: tuple[GpuDevice, ...]
    driver_version: int | None
    absent_reason: str | None


def read_gpus(sysfs: Sysfs | None = None) -> GpuInventory:
    """Every CUDA device. No driver or no GPU is reported, not raised."""
    try:
        ffi, lib = drv.driver()
    except LibraryNotFoundError:
        return GpuInventory((), None, "no CUDA driver (libcuda.so.1 not found)")
    version_p = ffi.new("int *")
    drv.check("cuDriverGetVersion", lib.cuDriverGetVersion(version_p))
    version = int(version_p[0])
    if drv.initialised_without_devices():
        return GpuInventory((), version, "the CUDA driver reports no GPU")
    count_p = ffi.new("int *")
    drv.check("cuDeviceGetCount", lib.cuDeviceGetCount(count_p))
    fs = sysfs or Sysfs()
    raw = [_read_device(ffi, lib, ordinal, fs) for ordinal in range(count_p[0])]
    raw.sort(key=lambda d: d.pci_bus_id)
    devices = tuple(dataclasses.replace(d, index=i) for i, d in enumerate(raw))
    return GpuInventory(devices, version, None if devices else "the CUDA driver reports no GPU")


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
    import uuid as uuidlib

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
    numa = _attr(ffi, lib, dev, drv.ATTR_HOST_NUMA_ID)
    source = "driver"
    if numa is None or numa < 0:
        from ..pcie import device_numa_node

        numa = device_numa_node(bus_id, fs)
        source = "sysfs" if numa is not None else "none"

    def a(attr: int) -> int:
        return _attr(ffi, lib, dev, attr) or 0

    return GpuDevice(
        index=ordinal,
        ordinal=ordinal,
        name=ffi.string(name).decode(),
        uuid="GPU-" + str(uuidlib.UUID(bytes=bytes(ffi.buffer(uu, 16)))),
        pci_bus_id=bus_id,
        total_memory=int(mem[0]),
        sm_count=a(drv.ATTR_MULTIPROCESSOR_COUNT),
        compute_capability=(
            a(drv.ATTR_COMPUTE_CAPABILITY_MAJOR),
            a(drv.ATTR_COMPUTE_CAPABILITY_MINOR),
        ),
        numa_node=numa,
        numa_node_source=source,
        can_map_host_memory=bool(a(drv.ATTR_CAN_MAP_HOST_MEMORY)),
        unified_addressing=bool(a(drv.ATTR_UNIFIED_ADDRESSING)),
        pageable_memory_access=bool(a(drv.ATTR_PAGEABLE_MEMORY_ACCESS)),
        host_register_supported=bool(a(drv.ATTR_HOST_REGISTER_SUPPORTED)),
        async_engines=a(drv.ATTR_ASYNC_ENGINE_COUNT),
        l2_cache=a(drv.ATTR_L2_CACHE_SIZE),
    )


def normalize_bus_id(bus_id: str) -> str:
    """'00000000:19:00.0' or '0000:19:00.0' -> '0000:19:00.0' (sysfs form)."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)
