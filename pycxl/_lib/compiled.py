"""The compiled native code (native/bench.c, native/copy.c as pycxl._bench), loaded on first use."""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from ..errors import NotAvailableError


@cache
def kernels() -> tuple[Any, Any]:
    """(ffi, lib) of pycxl._bench."""
    try:
        bench = importlib.import_module("pycxl._bench")
    except ImportError as e:
        raise NotAvailableError(
            "the benchmark kernels are not built (pycxl._bench is missing): reinstall "
            f"pycxl where a C compiler is present (pip install .) ({e})"
        ) from None
    return bench.ffi, bench.lib
