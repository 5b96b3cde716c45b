"""GPUs with their nearest host NUMA node, read without initialising CUDA where the driver
allows: NVML first (``nvml.py``), else the driver's files (``procfs.py``); the CUDA driver
(``cuda_devices.py``) only when asked, or when only CUDA can say which GPUs it shows
(``visible.py``). The model they build is in ``model.py``."""

from __future__ import annotations

import os

from ..base.sysfs import Sysfs
from .inventory import GpuDevice, GpuInventory, GpuSource

NO_DRIVER = "no CUDA driver (libcuda.so.1 not found)"


def read_gpus(sysfs: Sysfs | None = None, *, via: GpuSource = "auto") -> GpuInventory:
    """The GPUs CUDA shows this process. No driver or no GPU is reported, not raised.

    ``via``: 'auto' reads NVML, else the driver's files, and starts CUDA only where they
    cannot tell which GPUs CUDA shows or no NVIDIA driver file is there to read; 'nvml'
    the same, never starting CUDA; 'files' the driver's files alone (no library loaded);
    'cuda' every fact from the CUDA driver (about a quarter of a second to start). A
    recorded tree (a sysroot other than /) is read from its files alone."""
    fs = sysfs or Sysfs()
    if fs.root != "/":
        via, environ = "files", {}  # another machine's files: this process's CUDA_* do not apply
    else:
        environ = dict(os.environ)
    if via == "cuda":
        return _from_cuda(fs)
    from . import procfs
    from .visible import Undecided

    why = "no NVIDIA GPU driver"
    try:
        if via != "files":
            from . import nvml

            try:
                return nvml.read_inventory(fs, environ)
            except nvml.NvmlUnusable as e:
                why += f" ({e})"
        found = procfs.read_inventory(fs, environ)
        if found is not None:
            return found
    except Undecided as e:
        why = f"only CUDA can say which GPUs it shows: {e}"
    if via != "auto":
        return GpuInventory((), None, why)
    return _from_cuda(fs)


def _from_cuda(fs: Sysfs) -> GpuInventory:
    from ..base.errors import LibraryNotFoundError
    from . import cuda_devices

    try:
        return cuda_devices.read_inventory(fs)
    except LibraryNotFoundError:
        return GpuInventory((), None, NO_DRIVER)


def with_cuda_facts(g: GpuDevice) -> GpuDevice:
    """``g`` as the CUDA driver reports it, with what only CUDA knows (its ordinal, SM
    count, L2 cache, host-memory flags). Initialises CUDA: for code that needs a context."""
    if g.source == "cuda":
        return g
    from . import cuda_devices

    return cuda_devices.by_bus_id(g.pci_bus_id, g.index)
