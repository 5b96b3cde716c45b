"""GPU functions shipped as PTX modules (native/*.ptx), JIT-compiled by the driver for
the GPU at hand, and launched through the driver API. Memory is passed as the objects
that hold it (``pointer``); its device address is taken here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..base.errors import OperationError
from . import driver as drv
from .context import GpuContext
from .streams import Stream

CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
LOG_BYTES = 8192


@dataclass(frozen=True)
class Arg:
    """One argument of a GPU function, with its C type (the PTX parameter's)."""

    ctype: str  # 'unsigned long long', 'double'
    value: int | float


def u64(value: int) -> Arg:
    """A .u64 parameter: a count."""
    return Arg("unsigned long long", int(value))


def pointer(memory: Any) -> Arg:
    """A .u64 parameter that points at the start of ``memory``: DeviceMemory, host
    memory mapped for the GPU (HostMemory), or any CUDA array."""
    from .spans import device_span

    return Arg("unsigned long long", device_span(memory)[0])


def f64(value: float) -> Arg:
    """A .f64 parameter."""
    return Arg("double", float(value))


class Module:
    """A PTX module loaded into a context; on failure the JIT's log is in the error."""

    def __init__(self, ctx: GpuContext, ptx_name: str) -> None:
        ctx.activate()
        ffi, lib = drv.driver()
        text = resources.files("pycxl.native").joinpath(ptx_name).read_bytes() + b"\0"
        image = ffi.new("char[]", text)
        log = ffi.new("char[]", LOG_BYTES)
        options = ffi.new("int[]", [CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES])
        values = ffi.new("void *[]", [ffi.cast("void *", log), ffi.cast("void *", LOG_BYTES)])
        mod = ffi.new("CUmodule *")
        rc = int(lib.cuModuleLoadDataEx(mod, image, 2, options, values))
        if rc != 0:
            jit = ffi.string(log).decode(errors="replace").strip()
            err = drv.error("cuModuleLoadDataEx", rc)
            raise OperationError(f"{ptx_name}: {err}; JIT log: {jit or '(empty)'}") from err
        self.ctx = ctx  # the module lives in the context
        self.handle = mod[0]
        self._functions: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        """The function ``name`` of this module (looked up once)."""
        if name not in self._functions:
            ffi, lib = drv.driver()
            f = ffi.new("CUfunction *")
            drv.check(f"cuModuleGetFunction({name})",
                      lib.cuModuleGetFunction(f, self.handle, name.encode()))  # fmt: skip
            self._functions[name] = f[0]
        return self._functions[name]

    def launch(self, name: str, grid: int, block: int, stream: Stream, args: Sequence[Arg]) -> None:
        """Enqueue function ``name`` on ``stream``: ``grid`` blocks of ``block`` threads."""
        ffi, lib = drv.driver()
        values = [ffi.new(f"{a.ctype} *", a.value) for a in args]
        params = ffi.new("void *[]", [ffi.cast("void *", v) for v in values])
        rc = int(lib.cuLaunchKernel(self.function(name), grid, 1, 1, block, 1, 1, 0,
                                    stream.handle, params, ffi.NULL))  # fmt: skip
        if rc != 0:
            raise drv.error(f"cuLaunchKernel({name})", rc)
