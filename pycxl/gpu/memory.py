"""GPU memory and host memory the GPU can reach (both in a ``GpuContext``, ``context.py``).

``HostMemory`` pins and registers a host buffer (a NumaBuffer placed on a tier, or any
writable buffer / numpy array) with the CUDA driver, portable and device-mapped: the
GPU copies to and from it by DMA and can load from it directly (zero-copy). It exposes
``__cuda_array_interface__`` (the device pointer), so CuPy, Numba and PyTorch use it
without a copy, and unregisters on ``close()``, at the end of a ``with`` block, or when
collected. Registration is a long-term pin, which the kernel does not leave in ZONE_MOVABLE:
pages are counted per node around it, and a move is an error (or, when accepted,
reported), never silent.
"""

from __future__ import annotations

import resource
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..base.errors import InvalidRequestError, OperationError
from ..numa import longterm, pages
from . import driver as drv
from .context import GpuContext

if TYPE_CHECKING:
    import numpy as np

    from ..numa.placement import HugePages
    from .streams import Stream

CU_MEMHOSTREGISTER_PORTABLE = 0x01
CU_MEMHOSTREGISTER_DEVICEMAP = 0x02
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712
PAGE = pages.PAGE
REGISTER_CHUNK = 256 << 30  # the driver refuses single registrations of 512 GiB or more


def byte_array_interface(address: int, size: int) -> dict[str, Any]:
    """``__cuda_array_interface__`` of ``size`` bytes of device-visible memory at
    ``address``, as a 1-D byte array; no stream to synchronise with (the caller orders
    its work with events)."""
    return {
        "shape": (size,),
        "typestr": "|u1",
        "data": (address, False),
        "version": 3,
        "strides": None,
        "stream": None,
    }


def _register(ffi: Any, lib: Any, address: int, n: int, total: int) -> None:
    flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP
    rc = int(lib.cuMemHostRegister_v2(ffi.cast("void *", address), n, flags))
    if rc == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
        raise InvalidRequestError(
            f"the range at {address:#x} is already registered with CUDA; unregister it first"
        )
    if rc == CUDA_ERROR_OUT_OF_MEMORY:
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        raise OperationError(
            f"cannot pin {total} bytes: the driver is out of pinnable memory "
            f"(memlock limit {soft if soft >= 0 else 'unlimited'}); pin less, free "
            "pinned memory elsewhere, or raise the limit (ulimit -l unlimited, or "
            "LimitMEMLOCK=infinity for a service)"
        )
    drv.check("cuMemHostRegister", rc)


def _unregister_all(lib: Any, ffi: Any, addresses: tuple[int, ...]) -> None:
    for a in reversed(addresses):
        lib.cuMemHostUnregister(ffi.cast("void *", a))


class DeviceMemory:
    """``size`` bytes of one GPU's memory; freed on close or collection."""

    def __init__(self, ctx: GpuContext, size: int) -> None:
        if size <= 0:
            raise InvalidRequestError(f"device allocation size must be positive, not {size}")
        free = ctx.free_memory()
        if size > free:
            raise InvalidRequestError(
                f"{size} bytes do not fit in the GPU's free memory ({free} bytes)"
            )
        ffi, lib = drv.driver()
        p = ffi.new("CUdeviceptr *")
        drv.check("cuMemAlloc", lib.cuMemAlloc_v2(p, size))
        self.ctx = ctx  # the allocation lives as long as its context
        self.ptr = int(p[0])
        self.size = size
        self._free = weakref.finalize(self, lib.cuMemFree_v2, self.ptr)

    def __repr__(self) -> str:
        return f"DeviceMemory(ptr={self.ptr:#x}, size={self.size})"

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The memory as a 1-D byte array (CuPy, Numba and PyTorch wrap it, no copy)."""
        return byte_array_interface(self.ptr, self.size)

    def copy_from_host(self, src: Any, *, offset: int = 0, stream: Stream | None = None) -> None:
        """Copy all of ``src`` (a buffer, array or HostMemory) to this memory at
        ``offset``; with ``stream``, enqueued there (asynchronous), else done on return."""
        address, n = self._host_span(src, offset)
        ffi, lib = drv.driver()
        h = ffi.cast("void *", address)
        if stream is None:
            drv.check("cuMemcpyHtoD", lib.cuMemcpyHtoD_v2(self.ptr + offset, h, n))
        else:
            rc = lib.cuMemcpyHtoDAsync_v2(self.ptr + offset, h, n, stream.handle)
            drv.check("cuMemcpyHtoDAsync", rc)

    def copy_to_host(self, dst: Any, *, offset: int = 0, stream: Stream | None = None) -> None:
        """Copy ``len(dst)`` bytes from this memory at ``offset`` into ``dst``."""
        address, n = self._host_span(dst, offset)
        ffi, lib = drv.driver()
        h = ffi.cast("void *", address)
        if stream is None:
            drv.check("cuMemcpyDtoH", lib.cuMemcpyDtoH_v2(h, self.ptr + offset, n))
        else:
            rc = lib.cuMemcpyDtoHAsync_v2(h, self.ptr + offset, n, stream.handle)
            drv.check("cuMemcpyDtoHAsync", rc)

    def _host_span(self, host: Any, offset: int) -> tuple[int, int]:
        address, n = pages.buffer_span(host)
        if offset < 0 or offset + n > self.size:
            raise InvalidRequestError(
                f"{n} bytes at offset {offset} do not fit in {self.size} bytes of GPU memory"
            )
        return address, n

    def close(self) -> None:
        """Free the memory (idempotent)."""
        self._free()


class HostMemory:
    """A host buffer pinned, registered and mapped for the GPU.

    Registration takes a long-term pin, and the kernel moves long-term-pinned pages out
    of ZONE_MOVABLE (a CXL node onlined movable) to another node, silently. So the pages
    are counted per node before and after registering: if any left the node(s) the
    buffer was placed on (its bind policy's, else where they were), nothing stays
    registered and PlacementError says what happened and what to do, unless
    ``allow_migration`` accepts it. ``placement`` tells where the pages are.

    Registrations of ``chunk`` bytes or more are made in pieces (the NVIDIA driver
    refuses single registrations of 512 GiB or more on recent versions); with unified
    addressing the pieces form one range for the GPU, at the host's own addresses.
    """

    def __init__(
        self,
        ctx: GpuContext,
        buffer: Any,
        *,
        allow_migration: bool = False,
        chunk: int = REGISTER_CHUNK,
    ) -> None:
        address, length = pages.buffer_span(buffer)
        if address % PAGE or length % PAGE:
            raise InvalidRequestError(
                "host memory to register must start and end on a page boundary "
                f"(address {address:#x}, {length} bytes); allocate it with "
                "pycxl.allocate or mmap"
            )
        if chunk < PAGE or chunk % PAGE:
            raise InvalidRequestError(f"chunk must be a positive multiple of {PAGE} bytes")
        ffi, lib = drv.driver()
        registered: list[int] = []

        def unregister_all() -> None:
            for a in reversed(registered):
                lib.cuMemHostUnregister(ffi.cast("void *", a))

        def register() -> None:
            for off in range(0, length, chunk):
                _register(ffi, lib, address + off, min(chunk, length - off), length)
                registered.append(address + off)

        try:
            placed = longterm.pin_placement(buffer, register)
            dptr = ffi.new("CUdeviceptr *")
            rc = int(lib.cuMemHostGetDevicePointer_v2(dptr, ffi.cast("void *", address), 0))
            drv.check("cuMemHostGetDevicePointer", rc)
            if len(registered) > 1 and int(dptr[0]) != address:
                raise InvalidRequestError(
                    f"{length} bytes need {len(registered)} registrations, and without "
                    "unified addressing they are not one range on the GPU: pin less at once"
                )
            what = f"the {length}-byte buffer at {address:#x}"
            self.placement = longterm.check_pinned(placed, what, allow_migration=allow_migration)
        except BaseException:
            unregister_all()
            raise
        # Registration lives in the context: keeping it keeps the primary context from
        # being released (and the registration dropped) while this object exists.
        self.ctx = ctx
        self.buffer = buffer  # keeps the memory alive while registered
        self._owned = False  # allocate(): the buffer is freed on close too
        self.address = address
        self.size = length
        self.device_pointer = int(dptr[0])
        self._unregister = weakref.finalize(self, _unregister_all, lib, ffi, tuple(registered))

    @classmethod
    def allocate(
        cls,
        ctx: GpuContext,
        size: int,
        nodes: int | Sequence[int],
        *,
        huge: HugePages = "auto",
        allow_migration: bool = False,
        chunk: int = REGISTER_CHUNK,
    ) -> HostMemory:
        """``size`` bytes bound to ``nodes``, touched there, then pinned and mapped (and
        checked to be there still); ``close()`` unregisters and frees them. By name:
        ``pycxl.host_memory``."""
        from ..numa.placement import allocate

        buf = allocate(size, nodes, huge=huge)  # refused where the nodes lack the room
        return cls.owning(ctx, buf, allow_migration=allow_migration, chunk=chunk)

    @classmethod
    def owning(
        cls,
        ctx: GpuContext,
        buffer: Any,
        *,
        allow_migration: bool = False,
        chunk: int = REGISTER_CHUNK,
    ) -> HostMemory:
        """``buffer`` (a NumaBuffer) pinned and mapped, and closed with it (or at once,
        when registering fails): for a caller that has checked the room on its nodes
        already (a measurement, with ``Pair.check_fits``), so it is not read again."""
        try:
            mem = cls(ctx, buffer, allow_migration=allow_migration, chunk=chunk)
        except BaseException:
            buffer.close()
            raise
        mem._owned = True
        return mem

    def __repr__(self) -> str:
        state = "registered" if self._unregister.alive else "closed"
        return (
            f"HostMemory({self.size} bytes at {self.address:#x}, device pointer "
            f"{self.device_pointer:#x}, {state})"
        )

    def span(self) -> tuple[int, int]:
        """(address, length) of the registered host memory."""
        return self.address, self.size

    def array(self, dtype: Any = "uint8") -> np.ndarray:
        """A numpy view of the host memory (no copy); it keeps the memory alive."""
        import numpy as np

        if hasattr(self.buffer, "array"):  # a NumaBuffer
            view: np.ndarray = self.buffer.array(dtype)
            return view
        return np.frombuffer(self.buffer, dtype=dtype)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """A 1-D byte array at the device pointer (CuPy, Numba, PyTorch read it)."""
        return byte_array_interface(self.device_pointer, self.size)

    def pages_by_node(self) -> dict[int, int]:
        """Pages per NUMA node of the registered memory, now."""
        return pages.pages_by_node(self)

    def close(self) -> None:
        """Unregister the memory (and free it, when allocate() made it)."""
        self._unregister()
        if self._owned:
            self.buffer.close()

    def __enter__(self) -> HostMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
