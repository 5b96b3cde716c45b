"""The CUDA driver API (libcuda.so.1): loading, initialisation, error translation."""

from __future__ import annotations

import threading
from typing import Any

from ..base._lib.libs import LIBCUDA
from ..base._lib.loader import cstr
from ..base.errors import CudaError

CUDA_SUCCESS = 0
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_DEVICE = 101

# CUdevice_attribute values (cuda.h); one place for each.
ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_CAN_MAP_HOST_MEMORY = 19
ATTR_PCI_BUS_ID = 33
ATTR_L2_CACHE_SIZE = 38
ATTR_PCI_DEVICE_ID = 34
ATTR_ASYNC_ENGINE_COUNT = 40
ATTR_UNIFIED_ADDRESSING = 41
ATTR_PCI_DOMAIN_ID = 50
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76
ATTR_PAGEABLE_MEMORY_ACCESS = 88
ATTR_HOST_REGISTER_SUPPORTED = 99
ATTR_HOST_NUMA_ID = 134

_init_lock = threading.Lock()
_init_result: int | None = None


def driver() -> tuple[Any, Any]:
    """(ffi, lib) of libcuda, initialised once. LibraryNotFoundError when absent."""
    global _init_result
    ffi, lib = LIBCUDA.load()
    with _init_lock:
        if _init_result is None:
            _init_result = int(lib.cuInit(0))
    if _init_result not in (CUDA_SUCCESS, CUDA_ERROR_NO_DEVICE):
        raise error("cuInit", _init_result)
    return ffi, lib


def cuda_started() -> bool:
    """Whether this process has called cuInit (through this module)."""
    return _init_result is not None


def initialised_without_devices() -> bool:
    """cuInit reported that there is no CUDA device (a driver without a GPU)."""
    return _init_result == CUDA_ERROR_NO_DEVICE


def error(call: str, code: int) -> CudaError:
    """The CudaError for a driver call's result code, with the driver's name and text."""
    ffi, lib = LIBCUDA.load()
    name_p = ffi.new("const char **")
    text_p = ffi.new("const char **")
    name = "CUDA_ERROR_UNKNOWN"
    text = "unknown error"
    if lib.cuGetErrorName(code, name_p) == CUDA_SUCCESS:
        name = cstr(ffi, name_p[0]) or name
    if lib.cuGetErrorString(code, text_p) == CUDA_SUCCESS:
        text = cstr(ffi, text_p[0]) or text
    return CudaError(call, code, name, text)


def check(call: str, code: int) -> None:
    """Raise the CudaError of ``call`` unless ``code`` is CUDA_SUCCESS."""
    if code != CUDA_SUCCESS:
        raise error(call, code)
