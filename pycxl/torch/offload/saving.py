"""An offloaded model and its optimizer state saved to a folder and loaded back, one
tensor at a time, from and into the memory each lives in: no second copy of either
exists at any time (``optimizer.state_dict()`` clones every fp32 master and moment into
new host memory, 12 bytes a parameter more, which a model sized to the machine does not
have; tensor_files.py says how).

The folder is a checkpoint as ``save_pretrained`` writes one, which ``from_pretrained``
and ``offload_model(weights_from=...)`` read: the weights in one safetensors file a
block and one for the rest (``model-00001-of-00041.safetensors`` ...),
``model.safetensors.index.json`` and a transformers model's ``config.json``. Beside
them, the optimizer's state in files of its own, named by parameter
(``<name>.master``, ``.exp_avg``, ``.exp_avg_sq``, fp32), and
``optimizer.json``: each parameter's step count and the param groups' settings.
Every file is written under a temporary name and takes its own once all are written:
a save that fails leaves the folder as it was. A load checks every name, dtype and
shape in the files before it changes anything."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ...base.errors import InvalidRequestError
from .adam import AdamSteps
from .checkpoint import INDEX
from .layout import Block
from .rest import Entry
from .tensor_files import TensorFile, replace_all, write

OPTIMIZER = "optimizer.json"
STATE_KEYS = ("master", "exp_avg", "exp_avg_sq")
FORMAT = 1


def _folder(path: object) -> Path:
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise InvalidRequestError(f"folder {path!r}: give the path of a folder")
    return Path(path)


def _shards(model: Any, blocks: list[Block], keys: Iterable[str]) -> list[list[str]]:
    """``keys`` (state dict names) by block, in the blocks' order, and the rest last."""
    prefix = {id(m): name for name, m in model.named_modules()}
    starts = [prefix[id(B.module)] + "." for B in blocks]
    out: list[list[str]] = [[] for _ in range(len(blocks) + 1)]
    for k in keys:
        at = next((i for i, s in enumerate(starts) if k.startswith(s)), len(blocks))
        out[at].append(k)
    return [s for s in out if s]


def _unique(state: dict[str, Any]) -> dict[str, Any]:
    """A state dict without a tied tensor's second name (the first kept, as
    ``save_pretrained`` keeps it; weights_from finds it under either)."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out = {}
    for k, t in state.items():
        key = (t.data_ptr(), tuple(t.shape))
        if t.numel() and key in seen:
            continue
        seen.add(key)
        out[k] = t
    return out


def save(
    path: object,
    model: Any,
    blocks: list[Block],
    entries: list[Entry],
    steps: AdamSteps,
    groups: list[dict[str, Any]],
) -> Path:
    """The model's weights and the optimizer's state into the folder ``path``."""
    root = _folder(path)
    root.mkdir(parents=True, exist_ok=True)
    weights = _unique(model.state_dict())
    name_of = {id(p): n for n, p in model.named_parameters()}
    files: list[tuple[Path, list[tuple[str, Any]]]] = []
    shards = _shards(model, blocks, weights)
    weight_map = {}
    for i, keys in enumerate(shards):
        f = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        files.append((root / f, [(k, weights[k]) for k in keys]))
        weight_map.update(dict.fromkeys(keys, f))
    state = {name_of[id(e[0])]: e for e in entries}
    state_shards = _shards(model, blocks, state)
    for i, names in enumerate(state_shards):
        shard = root / f"optimizer-{i + 1:05d}-of-{len(state_shards):05d}.safetensors"
        files.append((shard, [(f"{n}.{k}", t) for n in names
                          for k, t in zip(STATE_KEYS, state[n][1:], strict=True)]))  # fmt: skip
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size()
                                            for t in weights.values())},
             "weight_map": weight_map}  # fmt: skip
    settings = {
        "format": FORMAT,
        "params": {n: {"step": steps.of(e[0])} for n, e in state.items()},
        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in groups],
    }
    written: list[tuple[Path, Path]] = []
    try:
        for final, tensors in files:
            tmp = final.with_name(f".{final.name}.partial")
            written.append((tmp, final))
            write(tmp, tensors)
        texts = [(root / INDEX, json.dumps(index, indent=1)),
                 (root / OPTIMIZER, json.dumps(settings, indent=1, default=_plain))]  # fmt: skip
        config_text = getattr(getattr(model, "config", None), "to_json_string", None)
        if callable(config_text):  # a transformers model's
            texts.append((root / "config.json", config_text()))
        for final, text in texts:
            tmp = final.with_name(f".{final.name}.partial")
            written.append((tmp, final))
            tmp.write_text(text)
    except BaseException:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
        raise
    replace_all(written)
    return root


def _plain(value: Any) -> Any:
    """A setting as JSON keeps it: a tensor (a learning rate given as one) as its number."""
    if hasattr(value, "item"):
        return value.item()
    raise InvalidRequestError(
        f"an optimizer setting of type {type(value).__name__} cannot be saved: give the "
        "param groups' settings as numbers, text or lists of them"
    )


class Saved:
    """A folder ``save`` wrote: its files' headers and the optimizer's settings, read."""

    def __init__(self, path: object) -> None:
        root = _folder(path)
        self.root = root
        try:
            index = json.loads((root / INDEX).read_text())["weight_map"]
            self.settings = json.loads((root / OPTIMIZER).read_text())
            ok = isinstance(index, dict) and self.settings.get("format") == FORMAT
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise InvalidRequestError(
                f"{root} is not a folder an offload saved ({e}): give the folder "
                "offload.save(folder) wrote"
            ) from None
        if not ok:
            raise InvalidRequestError(f"{root}/{OPTIMIZER} is not of format {FORMAT}: save again")
        opened: dict[str, TensorFile] = {}
        self.file_of: dict[str, TensorFile] = {}
        names = [(k, f) for k, f in index.items()]
        names += [(k, f.name) for f in sorted(root.glob("optimizer-*.safetensors"))
                  for k in TensorFile(f).entries]  # fmt: skip
        for k, f in names:
            if f not in opened:
                if not isinstance(f, str) or "/" in f or not (root / f).is_file():
                    raise InvalidRequestError(f"{root}: the file {f!r} of {k} is not there")
                opened[f] = TensorFile(root / f)
            self.file_of[k] = opened[f]

    def check(self, name: str, like: Any) -> None:
        """Refused by name unless the folder holds ``name`` of ``like``'s dtype and shape."""
        f = self.file_of.get(name)
        if f is None:
            raise InvalidRequestError(
                f"{self.root} has no {name}: load a folder saved from this model and optimizer"
            )
        f.check(name, like)

    def read_into(self, name: str, target: Any) -> None:
        """The named tensor into ``target``'s memory."""
        self.file_of[name].read_into(name, target)


def load(
    saved: Saved,
    model: Any,
    entries: list[Entry],
    steps: AdamSteps,
    groups: list[dict[str, Any]],
) -> None:
    """The weights and the optimizer's state from ``saved`` into where they live, every
    one checked before any is read."""
    from .._import import import_torch

    torch = import_torch()
    params = saved.settings.get("params", {})
    saved_groups = saved.settings.get("param_groups", [])
    if not isinstance(params, dict) or not isinstance(saved_groups, list) or \
            len(saved_groups) != len(groups):  # fmt: skip
        raise InvalidRequestError(
            f"{saved.root}/{OPTIMIZER}: {len(saved_groups)} param groups saved, the "
            f"optimizer has {len(groups)}: load a folder saved with this optimizer"
        )
    weights = _unique(model.state_dict())
    name_of = {id(p): n for n, p in model.named_parameters()}
    for k, t in weights.items():
        saved.check(k, t)
    todo: list[tuple[str, Any]] = list(weights.items())
    counts = {}
    for e in entries:
        n = name_of[id(e[0])]
        step = params.get(n, {}).get("step") if isinstance(params.get(n), dict) else None
        if not isinstance(step, int) or step < 0:
            raise InvalidRequestError(
                f"{saved.root}/{OPTIMIZER} has no step count for {n}: load a folder "
                "saved from this model and optimizer"
            )
        counts[id(e[0])] = step
        for k, t in zip(STATE_KEYS, e[1:], strict=True):
            saved.check(f"{n}.{k}", t)
            todo.append((f"{n}.{k}", t))
    with torch.no_grad():
        for k, t in todo:
            saved.read_into(k, t)
    steps.load(counts)
    for g, s in zip(groups, saved_groups, strict=True):
        g.update({k: v for k, v in s.items() if k != "params"})
