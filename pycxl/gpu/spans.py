"""(address, bytes) of the memory a copy reads or writes: host memory (pinned or not)
and device memory, from the objects that hold it (never raw pointers from callers)."""

from __future__ import annotations

from typing import Any

from ..base.errors import InvalidRequestError


def host_span(obj: Any) -> tuple[int, int]:
    """(address, bytes) of contiguous host memory: a HostMemory or NumaBuffer, a numpy
    array, a buffer, or a CPU torch tensor."""
    from ..numa.pages import buffer_span

    return buffer_span(obj)


def device_span(obj: Any) -> tuple[int, int]:
    """(device address, bytes) of contiguous device memory: a CUDA torch tensor (any
    dtype, bf16 too), or anything with ``__cuda_array_interface__`` (CuPy, Numba,
    pycxl's views)."""
    from ..numa.pages import tensor_span

    span = tensor_span(obj, "cuda")
    if span is not None:
        return span
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        raise InvalidRequestError(
            f"{type(obj).__name__} is not device memory: pass an object with "
            "__cuda_array_interface__ (a CUDA tensor or array)"
        )
    shape = tuple(cai["shape"])
    itemsize = int(cai["typestr"][2:])
    count = 1
    for d in shape:
        count *= d
    strides = cai.get("strides")
    if strides is not None:
        expected, step = [], itemsize
        for d in reversed(shape):
            expected.append(step)
            step *= d
        if count > 1 and tuple(reversed(expected)) != tuple(strides):
            raise InvalidRequestError("the device array is not contiguous")
    return int(cai["data"][0]), count * itemsize
