"""safetensors files written straight from tensors' memory and read straight into it.
The format (an 8-byte header length, a JSON header of each tensor's dtype, shape and
byte offsets, then the bytes) is written here rather than by the ``safetensors``
package, whose ``save_file`` builds each tensor's bytes as a new object first: a CPU
tensor here is written from its own memory, and read back into the memory it is to
live in (the tier's), so no second copy of a model's state exists at any time. A GPU
tensor passes through one host copy of itself. The files are ordinary safetensors:
``safe_open`` and ``from_pretrained`` read them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, BinaryIO

from ...base.errors import InvalidRequestError
from .._import import import_torch

HEADER_MAX = 100_000_000  # safetensors' own limit on a header's bytes
_ALIGN = 8
_NAMES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
    "complex64": "C64",
}  # torch's dtype names (those this torch has) and safetensors'


def _dtypes() -> dict[Any, str]:
    torch = import_torch()
    return {getattr(torch, k): v for k, v in _NAMES.items() if hasattr(torch, k)}


def _raw(t: Any) -> Any:
    """``t``'s bytes as a buffer over a CPU tensor's memory (a GPU tensor's host copy;
    a strided view's contiguous copy: only ever one tensor's)."""
    torch = import_torch()
    t = t.detach().contiguous()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.reshape(-1).view(torch.uint8).numpy()


def write(f: BinaryIO, tensors: list[tuple[str, Any]], metadata: dict[str, str]) -> None:
    """``tensors`` (name, tensor) as a safetensors file into ``f``, in that order, with
    ``metadata`` (text to text) in its header."""
    dtypes = _dtypes()
    header: dict[str, Any] = {"__metadata__": {"format": "pt", **metadata}}
    offset = 0
    for name, t in tensors:
        if t.dtype not in dtypes:
            raise InvalidRequestError(f"{name}: a tensor of {t.dtype} has no safetensors type")
        size = t.numel() * t.element_size()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}  # fmt: skip
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % _ALIGN)
    f.write(len(raw).to_bytes(8, "little"))
    f.write(raw)
    for _, t in tensors:
        f.write(_raw(t))


class TensorFile:
    """One safetensors file's header, read and checked; tensors read into place."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.is_file():  # a FIFO would block the read
            raise InvalidRequestError(f"{path} is not a regular file: give the checkpoint's own")
        try:
            with path.open("rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size)) if 0 < size <= HEADER_MAX else None
            length = path.stat().st_size
        except (OSError, ValueError) as err:
            raise InvalidRequestError(f"{path} cannot be read ({err})") from None
        if not isinstance(header, dict):
            raise InvalidRequestError(f"{path} is not a safetensors file (no header)")
        meta = header.pop("__metadata__", None)
        self.metadata: dict[str, Any] = meta if isinstance(meta, dict) else {}
        self._start = 8 + size
        self.entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name, e in header.items():
            try:
                dtype, shape, (begin, end) = e["dtype"], tuple(e["shape"]), e["data_offsets"]
                ok = all(isinstance(v, int) and v >= 0 for v in (*shape, begin, end))
            except (TypeError, KeyError, ValueError):
                ok = False
            if not ok or not begin <= end <= length - self._start:
                raise InvalidRequestError(
                    f"{path}: the entry of {name} is not a tensor's, or the file is cut "
                    "short: the file is damaged; save it again"
                )
            self.entries[name] = (dtype, shape, begin, end)

    def check(self, name: str, like: Any) -> None:
        """Refused by name unless the file holds ``name`` of ``like``'s dtype and shape."""
        e = self.entries.get(name)
        want = (_dtypes().get(like.dtype, str(like.dtype)), tuple(like.shape))
        if e is None:
            raise InvalidRequestError(
                f"{self.path} has no {name}: load a folder saved from this model"
            )
        if (e[0], e[1]) != want or e[3] - e[2] != like.numel() * like.element_size():
            raise InvalidRequestError(
                f"{name} in {self.path} is {e[0]} {list(e[1])}, this model's {want[0]} "
                f"{list(want[1])}: load a folder saved from this model"
            )

    def read_into(self, name: str, target: Any) -> None:
        """The named tensor's bytes into ``target`` (checked first with ``check``): into
        a CPU tensor's own memory, into a GPU tensor through one host copy."""
        torch = import_torch()
        _, _, begin, end = self.entries[name]
        host = target if target.device.type == "cpu" and target.is_contiguous() else None
        if host is None:
            host = torch.empty(target.shape, dtype=target.dtype)
        view = memoryview(host.reshape(-1).view(torch.uint8).numpy())
        with self.path.open("rb") as f:
            f.seek(self._start + begin)
            got = f.readinto(view)
        if got != end - begin:
            raise InvalidRequestError(f"{self.path} ends inside {name}: the file is cut short")
        if host is not target:
            target.copy_(host)
