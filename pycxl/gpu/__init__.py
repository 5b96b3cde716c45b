"""GPUs through the CUDA driver API."""

from .devices import GpuDevice, GpuInventory, read_gpus

__all__ = ["GpuDevice", "GpuInventory", "read_gpus"]
