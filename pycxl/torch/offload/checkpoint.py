"""A model's weights read from safetensors files one tensor at a time, for
``offload_model(weights_from=...)``. A model built on the ``meta`` device (nothing of it
allocated) gets each parameter made where its placement keeps it, the GPU or its home on
the tier, straight from the file: no whole copy of the model exists anywhere, in any
precision. The optimizer's fp32 master starts from the file's values (an fp32
checkpoint's, not their bf16 rounding).

Checked before anything is allocated: every parameter has a tensor of its shape in the
files (under any of its names: a tied head is found under the embedding's), and every
buffer on ``meta`` can be made (a persistent one from the files; one the model computes,
a rotary embedding's frequencies, by the model's own initialisation of a module without
parameters)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from ...base.errors import InvalidRequestError
from .._import import import_torch
from .tensor_files import TensorFile

INDEX = "model.safetensors.index.json"


class StartingValues(Protocol):
    """Where parameters' starting values come from: a checkpoint (``WeightSource``) or
    the model's own initialisation (``initialise.ModelInit``)."""

    def has(self, name: str) -> bool:
        """Whether a buffer of this name is read from here (else the model makes it)."""
        ...

    def read(self, name: str) -> Any:
        """The named parameter's starting values."""
        ...


class WeightSource:
    """Tensors by name across one checkpoint's safetensors files, read on demand."""

    def __init__(self, file_of: dict[str, Path], where: str) -> None:
        self._file_of = file_of  # tensor name -> its file
        self._where = where
        self._open: dict[Path, Any] = {}

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> WeightSource:
        """A ``.safetensors`` file, or a folder holding ``model.safetensors.index.json``
        (a sharded checkpoint, as ``save_pretrained`` writes one) or ``.safetensors``
        files; refused by name where there is none."""
        if not isinstance(path, str | os.PathLike) or not os.fspath(path):
            raise InvalidRequestError(
                f"weights_from {path!r}: give a .safetensors file or the folder of a checkpoint"
            )
        root = Path(path)
        if root.is_file():
            files = [root]
        elif (root / INDEX).is_file():
            try:
                weight_map = json.loads((root / INDEX).read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise InvalidRequestError(
                    f"{root / INDEX} is not a safetensors index ({e}): save the "
                    "checkpoint again (model.save_pretrained(folder))"
                ) from None
            return cls({k: root / f for k, f in weight_map.items()}, str(root))
        elif root.is_dir():  # regular files only: a FIFO named so would block the read
            files = sorted(f for f in root.glob("*.safetensors") if f.is_file())
        elif root.exists():
            raise InvalidRequestError(
                f"weights_from {root} is not a regular file or a folder: give a "
                ".safetensors file or the folder of a checkpoint"
            )
        else:
            raise InvalidRequestError(f"weights_from {root}: no such file or folder")
        if not files:
            raise InvalidRequestError(
                f"weights_from {root}: no .safetensors file there: give the folder "
                "model.save_pretrained(folder) wrote, or one .safetensors file"
            )
        file_of: dict[str, Path] = {}
        for f in files:
            for name in TensorFile(f).entries:
                file_of[name] = f
        return cls(file_of, str(root))

    def _handle(self, f: Path) -> Any:
        if f not in self._open:
            try:
                from safetensors import safe_open
            except ImportError:
                raise InvalidRequestError(
                    "reading weights_from needs the safetensors package: pip install safetensors"
                ) from None
            try:
                self._open[f] = safe_open(str(f), framework="pt", device="cpu")
            except Exception as e:  # safetensors' own error types: a file it cannot read
                raise InvalidRequestError(f"{f} is not a safetensors file ({e})") from None
        return self._open[f]

    def has(self, name: str) -> bool:
        """Whether the files hold a tensor of this name."""
        return name in self._file_of

    def shape_of(self, name: str) -> tuple[int, ...]:
        """The named tensor's shape, from the file's header."""
        return tuple(self._handle(self._file_of[name]).get_slice(name).get_shape())

    def read(self, name: str) -> Any:
        """The named tensor, on the CPU, in the file's precision."""
        return self._handle(self._file_of[name]).get_tensor(name)

    def names_of(self, model: Any) -> dict[int, str]:
        """Each parameter's name in the files (by id), checked: present, of its shape;
        and each buffer on ``meta`` one that can be made. Refused by name otherwise."""
        names: dict[int, str] = {}
        aliases: dict[int, list[str]] = {}
        params = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(name)
            params[id(p)] = p
        for ident, p in params.items():
            found = next((n for n in aliases[ident] if n in self._file_of), None)
            if found is None:
                some = next(iter(self._file_of), "none")
                raise InvalidRequestError(
                    f"{aliases[ident][0]} is not in the checkpoint at {self._where} (it "
                    f"holds {len(self._file_of)} tensors, {some} among them): give the "
                    "checkpoint of this model"
                )
            shape = self.shape_of(found)
            if shape != tuple(p.shape):
                raise InvalidRequestError(
                    f"{found} is {list(shape)} in the checkpoint and {list(p.shape)} in the "
                    "model: build the model from the checkpoint's config"
                )
            names[ident] = found
        for name, module, buf_name in meta_buffers(model):
            if not self.has(name) and not computable(model, module, buf_name):
                raise InvalidRequestError(
                    f"buffer {name} is on the meta device and not in the checkpoint: "
                    "build the model with its parameters only on meta (accelerate's "
                    "init_empty_weights()), or give it the buffer's value"
                )
        return names

    def close(self) -> None:
        """Let go of the open files."""
        self._open.clear()


def meta_buffers(model: Any) -> list[tuple[str, Any, str]]:
    """(full name, owning module, its name there) of each buffer on ``meta``."""
    out = []
    for prefix, module in model.named_modules():
        for buf_name, buf in module._buffers.items():
            if buf is not None and buf.is_meta:
                out.append((f"{prefix}.{buf_name}" if prefix else buf_name, module, buf_name))
    return out


def computable(model: Any, module: Any, buf_name: str) -> bool:
    """A buffer the model computes (not saved), in a module without parameters that a
    transformers model's own ``_init_weights`` initialises."""
    return (
        buf_name in module._non_persistent_buffers_set
        and not any(True for _ in module.parameters(recurse=False))
        and callable(getattr(model, "_init_weights", None))
    )


def place(param: Any, tensor: Any) -> None:
    """``param`` (the same object: the optimizer and hooks keep it) now holds
    ``tensor``'s memory; a ``meta`` parameter takes it by swapping its contents."""
    torch = import_torch()
    if param.is_meta:
        torch.utils.swap_tensors(
            param, torch.nn.Parameter(tensor, requires_grad=param.requires_grad)
        )
    else:
        param.data = tensor


def materialise(
    model: Any, source: StartingValues, names: dict[int, str], device: Any, keep: set[int]
) -> None:
    """Every parameter but those in ``keep`` (ids: homes on the tier, filled as they are
    placed) read onto ``device`` in its own precision, one at a time; buffers on
    ``meta`` made there, from the files or by the model's own initialisation."""
    torch = import_torch()
    with torch.no_grad():
        for p in model.parameters():
            if id(p) not in keep:
                place(p, source.read(names[id(p)]).to(device=device, dtype=p.dtype))
        computed = []
        for name, module, buf_name in meta_buffers(model):
            buf = module._buffers[buf_name]
            if source.has(name):
                module._buffers[buf_name] = source.read(name).to(device=device, dtype=buf.dtype)
            else:
                module._buffers[buf_name] = torch.empty_like(buf, device=device)
                computed.append(module)
        for module in dict.fromkeys(computed):
            model._init_weights(module)
