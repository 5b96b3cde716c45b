"""Only what pyproject.toml cannot say: the benchmark kernels are built by cffi."""

from setuptools import setup

setup(cffi_modules=["native/build_bench.py:ffibuilder"])
