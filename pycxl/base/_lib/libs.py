"""The libraries pycxl binds, with the package that provides each."""

from __future__ import annotations

from .loader import SharedLibrary

LIBCXL = SharedLibrary(("libcxl.so.1",), "libcxl", "libcxl1 (Debian/Ubuntu) or ndctl-libs (Fedora)")
LIBNUMA = SharedLibrary(("libnuma.so.1",), "libnuma", "libnuma1 (Debian/Ubuntu) or numactl-libs")
LIBCUDA = SharedLibrary(("libcuda.so.1", "libcuda.so"), "cuda", "the NVIDIA driver (libcuda.so.1)")
LIBNVML = SharedLibrary(
    ("libnvidia-ml.so.1",), "nvml", "the NVIDIA driver's NVML (libnvidia-ml.so.1)"
)
