"""GPUs: found through NVML or the driver's files, used through the CUDA driver API.

The names below load on first use: ``pycxl list`` starts NVML (``nvml_session``) before
the GPU inventory is imported."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base._lazy import lazy_exports

if TYPE_CHECKING:
    from .devices import read_gpus as read_gpus, with_cuda_facts as with_cuda_facts
    from .inventory import GpuDevice as GpuDevice, GpuInventory as GpuInventory

# every exported name and the module it loads from (a test holds the imports above equal)
_LAZY = {
    **dict.fromkeys(("GpuDevice", "GpuInventory"), "inventory"),
    **dict.fromkeys(("read_gpus", "with_cuda_facts"), "devices"),
}
__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
