"""Only what pyproject.toml cannot say: the benchmark kernels and the prebuilt declarations
of NVML and the CUDA driver are built by cffi."""

from setuptools import setup

setup(
    cffi_modules=[
        "native/build_bench.py:ffibuilder",
        "native/build_abi.py:nvml",
        "native/build_abi.py:cuda",
    ]
)
