"""The primary context of one GPU: what every CUDA call here runs in, and the GPU's CUDA
ordinal (what PyTorch's ``torch.device("cuda", n)`` takes)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from ..base.errors import InvalidRequestError
from . import driver as drv

if TYPE_CHECKING:
    from .inventory import GpuDevice


class GpuContext:
    """The primary context of CUDA device ``ordinal``, current on the calling thread.
    From a ``GpuDevice``: ``GpuContext.of(gpu)``."""

    def __init__(self, ordinal: int) -> None:
        ffi, lib = drv.driver()
        count = ffi.new("int *")
        drv.check("cuDeviceGetCount", lib.cuDeviceGetCount(count))
        if not 0 <= ordinal < count[0]:
            raise InvalidRequestError(f"CUDA device {ordinal} does not exist ({count[0]} found)")
        dev = ffi.new("CUdevice *")
        drv.check("cuDeviceGet", lib.cuDeviceGet(dev, ordinal))
        self.ordinal = ordinal
        self.device = int(dev[0])
        ctx = ffi.new("CUcontext *")
        drv.check("cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain(ctx, self.device))
        self.handle = ctx[0]
        self.activate()
        self._release = weakref.finalize(self, lib.cuDevicePrimaryCtxRelease_v2, self.device)

    @classmethod
    def of(cls, gpu: GpuDevice) -> GpuContext:
        """The primary context of ``gpu``, found by its PCI address (CUDA numbers GPUs its
        own way; CUDA_VISIBLE_DEVICES renumbers them): the one way from a GPU to its
        context and ordinal (``.ordinal``)."""
        from .cuda_devices import ordinal_of

        return cls(ordinal_of(gpu.pci_bus_id))

    def __repr__(self) -> str:
        return f"GpuContext(device {self.device}, primary)"

    def activate(self) -> None:
        """Make this context current on the calling thread."""
        _, lib = drv.driver()
        drv.check("cuCtxSetCurrent", lib.cuCtxSetCurrent(self.handle))

    def free_memory(self) -> int:
        """Bytes of the GPU's memory free now."""
        ffi, lib = drv.driver()
        free, total = ffi.new("size_t *"), ffi.new("size_t *")
        drv.check("cuMemGetInfo", lib.cuMemGetInfo_v2(free, total))
        return int(free[0])
