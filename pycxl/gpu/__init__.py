"""GPUs: found through NVML or the driver's files, used through the CUDA driver API."""

from .devices import GpuDevice, GpuInventory, read_gpus, with_cuda_facts

__all__ = ["GpuDevice", "GpuInventory", "read_gpus", "with_cuda_facts"]
