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
(``<name>.master``, ``.exp_avg``, ``.exp_avg_sq``, fp32), and ``optimizer.json``: the
files, each parameter's step count and group, and the param groups' settings.

Every file is written under a temporary name, flushed to the disk, and takes its own
(and the mode and owner of the file it replaces: outfiles.py) once all are written,
``optimizer.json`` last; files of an earlier save there that this
one does not use are removed. Every file carries the save's id: a load refuses a
folder whose files come from two saves (a save cut short while renaming). A load checks
every name, dtype, shape, step count and setting before it changes anything, and
refuses a folder that holds what this model does not (another model's)."""

from __future__ import annotations

import functools
import json
import os
import re
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from ...base import outfiles
from ...base.errors import InvalidRequestError, OperationError
from .adam import AdamSteps
from .checkpoint import INDEX
from .layout import Block
from .rest import Entry
from .tensor_files import TensorFile, write

OPTIMIZER = "optimizer.json"
STATE_KEYS = ("master", "exp_avg", "exp_avg_sq")
FORMAT = 1
_SHARD = re.compile(r"(model|optimizer)-\d{5}-of-\d{5}\.safetensors")
_FIX = "load a folder saved from this model and optimizer (offload.save)"


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
    seen: set[tuple[Any, ...]] = set()
    out = {}
    for k, t in state.items():
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
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
    if root.exists() and not root.is_dir():
        raise InvalidRequestError(f"{root} is a file, not a folder: give a folder to save into")
    save_id = uuid.uuid4().hex
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
    group_of = {id(p): g for g, group in enumerate(groups) for p in group["params"]}
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size()
                                            for t in weights.values()), "save": save_id},
             "weight_map": weight_map}  # fmt: skip
    settings = {
        "format": FORMAT,
        "save": save_id,
        "files": [f.name for f, _ in files if f.name.startswith("optimizer-")],
        "params": {
            n: {"step": steps.of(e[0]), "group": group_of[id(e[0])]} for n, e in state.items()
        },
        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in groups],
    }
    texts = [(root / INDEX, json.dumps(index, indent=1))]
    config_text = _config_text(model)
    if config_text is not None:
        texts.append((root / "config.json", config_text))
    texts.append((root / OPTIMIZER, json.dumps(settings, indent=1, default=_plain)))
    made = not root.exists()
    staged: list[tuple[str, Path]] = []
    try:
        try:
            root.mkdir(parents=True, exist_ok=True)
            for final, tensors in files:
                fill = functools.partial(write, tensors=tensors, metadata={"save": save_id})
                staged.append((outfiles.stage(str(final), fill), final))
            for final, text in texts:
                fill = functools.partial(_write_bytes, data=text.encode())
                staged.append((outfiles.stage(str(final), fill), final))
        except (OSError, OperationError) as e:
            raise InvalidRequestError(f"saving into {root} failed ({e}): the folder is as "
                                      "it was; free the room or fix the path, and save "
                                      "again") from None  # fmt: skip
        try:
            for tmp, final in staged:  # optimizer.json last: the save is whole once it is
                outfiles.commit(tmp, str(final))
        except OperationError as e:
            raise InvalidRequestError(f"saving into {root} failed while renaming ({e}): its "
                                      "files are of two saves now, which load refuses; "
                                      "save again") from None  # fmt: skip
    finally:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        if made and root.is_dir() and not any(root.iterdir()):
            root.rmdir()
    ours = {final.name for _, final in staged}
    for old in root.iterdir():  # an earlier save's shards this one does not use
        if _SHARD.fullmatch(old.name) and old.name not in ours and old.is_file():
            old.unlink()
    return root


def _write_bytes(f: BinaryIO, data: bytes) -> None:
    f.write(data)


def _config_text(model: Any) -> str | None:
    """A transformers model's config as ``save_pretrained`` writes it (its class
    named among the architectures); None for another model."""
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        return None
    fields = dict(to_dict())
    fields["architectures"] = [type(model).__name__]
    return json.dumps(fields, indent=2, sort_keys=True, default=str) + "\n"


def _plain(value: Any) -> Any:
    """A setting as JSON keeps it: a tensor (a learning rate given as one) as its number."""
    if hasattr(value, "item"):
        return value.item()
    raise InvalidRequestError(
        f"an optimizer setting of type {type(value).__name__} cannot be saved: give the "
        "param groups' settings as numbers, text or lists of them"
    )


class Saved:
    """A folder ``save`` wrote: its files' headers and the optimizer's settings, read
    and checked to be of one save."""

    def __init__(self, path: object) -> None:
        root = _folder(path)
        self.root = root
        try:
            index = json.loads((root / INDEX).read_text())
            self.settings = json.loads((root / OPTIMIZER).read_text())
            weight_map = index["weight_map"]
            save_id = self.settings["save"]
            files = self.settings["files"]
            ok = (self.settings.get("format") == FORMAT and isinstance(weight_map, dict)
                  and isinstance(files, list))  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise InvalidRequestError(
                f"{root} is not a folder an offload saved ({e}): give the folder "
                "offload.save(folder) wrote"
            ) from None
        if not ok:
            raise InvalidRequestError(f"{root}/{OPTIMIZER} is not of format {FORMAT}: save again")
        opened: dict[str, TensorFile] = {}
        self.file_of: dict[str, TensorFile] = {}
        for f in [*weight_map.values(), *files]:
            if not isinstance(f, str) or not _SHARD.fullmatch(f):
                raise InvalidRequestError(f"{root}: {f!r} is not a file a save writes: save again")
            if f not in opened:
                opened[f] = TensorFile(root / f)
                if opened[f].metadata.get("save") != save_id:
                    raise InvalidRequestError(
                        f"{root / f} is of another save than {OPTIMIZER} (a save cut short, "
                        "or files copied in): save again, or load the folder of one save"
                    )
        for k, f in weight_map.items():
            if k not in opened[f].entries:
                raise InvalidRequestError(
                    f"{root / f} has no {k}, which the index names: save again"
                )
            self.file_of[k] = opened[f]
        for f in files:
            for k in opened[f].entries:
                self.file_of[k] = opened[f]

    def check(self, name: str, like: Any) -> None:
        """Refused by name unless the folder holds ``name`` of ``like``'s dtype and shape."""
        f = self.file_of.get(name)
        if f is None:
            raise InvalidRequestError(f"{self.root} has no {name}: {_FIX}")
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
    weights = _unique(model.state_dict())
    name_of = {id(p): n for n, p in model.named_parameters()}
    todo: list[tuple[str, Any]] = list(weights.items())
    counts = {}
    params = _params(saved, len(groups))
    group_of = {id(p): g for g, group in enumerate(groups) for p in group["params"]}
    for e in entries:
        n = name_of[id(e[0])]
        got = params.get(n)
        if got is None or got["group"] != group_of[id(e[0])]:
            where = "no entry" if got is None else f"param group {got['group']}"
            raise InvalidRequestError(
                f"{saved.root}/{OPTIMIZER} has {where} for {n}, which is in param group "
                f"{group_of[id(e[0])]} here: {_FIX}"
            )
        counts[id(e[0])] = got["step"]
        todo += [(f"{n}.{k}", t) for k, t in zip(STATE_KEYS, e[1:], strict=True)]
    for k, t in todo:
        saved.check(k, t)
    extra = sorted(saved.file_of.keys() - {k for k, _ in todo}) + sorted(
        params.keys() - {name_of[id(e[0])] for e in entries}
    )
    if extra:
        raise InvalidRequestError(
            f"{saved.root} holds {len(extra)} tensors or entries this model does not have, "
            f"{extra[0]} among them: {_FIX}"
        )
    settings = _settings(saved, groups)
    with torch.no_grad():
        for k, t in todo:
            saved.read_into(k, t)
    steps.load(counts)
    for g, s in zip(groups, settings, strict=True):
        g.update(s)


def _params(saved: Saved, groups: int) -> dict[str, dict[str, int]]:
    """Each parameter's step count and group, as saved, checked."""
    params = saved.settings.get("params")
    if not isinstance(params, dict):
        raise InvalidRequestError(f"{saved.root}/{OPTIMIZER} has no params: save again")
    for n, p in params.items():
        ok = isinstance(p, dict) and all(
            isinstance(p.get(k), int) and not isinstance(p.get(k), bool) and p[k] >= 0
            for k in ("step", "group")
        )
        if not ok or p["group"] >= groups:
            raise InvalidRequestError(
                f"{saved.root}/{OPTIMIZER}: the entry of {n} is not a step count and a "
                f"param group of {groups}: {_FIX}"
            )
    return params


def _settings(saved: Saved, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The param groups' saved settings, each of the kind the optimizer's own is (a
    number for a number, a list of numbers for a tuple, a flag for a flag)."""
    saved_groups = saved.settings.get("param_groups")
    if not isinstance(saved_groups, list) or len(saved_groups) != len(groups):
        n = len(saved_groups) if isinstance(saved_groups, list) else "no"
        raise InvalidRequestError(
            f"{saved.root}/{OPTIMIZER}: {n} param groups saved, the optimizer has "
            f"{len(groups)}: load a folder saved with this optimizer"
        )
    out = []
    for i, (group, s) in enumerate(zip(groups, saved_groups, strict=True)):
        if not isinstance(s, dict):
            raise InvalidRequestError(f"{saved.root}/{OPTIMIZER}: param group {i} is not one")
        kept = {}
        for k, v in s.items():
            if k == "params" or k not in group:
                continue
            if not _same_kind(group[k], v):
                raise InvalidRequestError(
                    f"{saved.root}/{OPTIMIZER}: param group {i}'s {k} is {v!r}, where the "
                    f"optimizer's is {group[k]!r}: {_FIX}"
                )
            kept[k] = tuple(v) if isinstance(group[k], tuple) else v
        out.append(kept)
    return out


def _same_kind(mine: Any, saved: Any) -> bool:
    if isinstance(mine, bool) or mine is None:
        return type(saved) is type(mine)
    if isinstance(mine, int | float) or hasattr(mine, "item"):  # a tensor's number too
        return isinstance(saved, int | float) and not isinstance(saved, bool)
    if isinstance(mine, tuple | list):
        return (
            isinstance(saved, list)
            and len(saved) == len(mine)
            and all(_same_kind(a, b) for a, b in zip(mine, saved, strict=True))
        )
    return isinstance(saved, type(mine))
