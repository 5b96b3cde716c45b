"""A model built on the ``meta`` device initialised by its own initialisation, one module
at a time, for ``offload_model(initialise=True)``: each module that holds parameters is
made on the device the offload trains on (the GPU's random numbers are drawn where a
host's CPU would take minutes for billions of them), initialised there
(``reset_parameters``, then a transformers model's ``_init_weights``) and its values
taken where their placement keeps them: no whole copy of the model exists anywhere.
A parameter neither initialisation sets is refused by name, since its values would be
whatever the memory held; one module of each kind is initialised before anything is
placed, so that such a model is refused while nothing is made."""

from __future__ import annotations

import copy
from typing import Any

from ...base.errors import InvalidRequestError
from .._import import import_torch
from .checkpoint import computable, meta_buffers


class ModelInit:
    """The starting values of a model's parameters (the one ``names_of`` is given), made
    on ``device`` on demand, with the interface of a checkpoint (``WeightSource``):
    ``names_of``, ``has``, ``read``."""

    def __init__(self, device: Any) -> None:
        self._device = device
        self._model: Any = None
        self._owner: dict[str, Any] = {}  # parameter name -> the module holding it
        self._made: dict[str, Any] = {}  # the last module's values not yet read
        self._index: dict[int, int] = {}  # a module's position in the model
        # each module drawn from a seed of its own (this one's, plus its index): the same
        # values whichever order the placement reads them in, one draw from the caller's
        # generator so that torch.manual_seed decides them
        self._seed = int(import_torch().randint(1 << 62, ()))

    def names_of(self, model: Any) -> dict[int, str]:
        """Each parameter's name (by id; a tied one under its first), checked: on
        ``meta``, and each buffer on ``meta`` one the model computes."""
        self._model = model
        self._index = {id(m): i for i, m in enumerate(model.modules())}
        names: dict[int, str] = {}
        for prefix, module in model.named_modules():
            for local, p in module.named_parameters(recurse=False):
                name = f"{prefix}.{local}" if prefix else local
                if not p.is_meta:
                    raise InvalidRequestError(
                        f"{name} holds values already: initialise=True makes a model built "
                        "on the meta device (with torch.device('meta'): ...)"
                    )
                if id(p) not in names:
                    names[id(p)] = name
                    self._owner[name] = (prefix, module)
        # one module of each kind initialised now, before any memory is placed: a
        # parameter its initialisation leaves unset is refused while nothing is made
        tried: set[type] = set()
        for prefix, module in self._owner.values():
            if type(module) not in tried:
                tried.add(type(module))
                self._initialised(prefix, module)
        for name, module, buf_name in meta_buffers(model):
            if not computable(model, module, buf_name):
                raise InvalidRequestError(
                    f"buffer {name} is on the meta device and the model does not compute "
                    "it: build the model with its parameters only on meta (accelerate's "
                    "init_empty_weights()), or give a checkpoint (weights_from=)"
                )
        return names

    def has(self, name: str) -> bool:
        """Buffers are the model's to compute: none is read from here."""
        return False

    def read(self, name: str) -> Any:
        """The parameter's starting values, on the device, in its own precision: its
        module (all of its parameters at once) initialised on the first read of one."""
        if name not in self._made:
            prefix, module = self._owner[name]
            self._made = self._initialised(prefix, module)
        return self._made.pop(name)

    def close(self) -> None:
        """Every value is where it lives: nothing is held."""
        self._made.clear()

    def _initialised(self, prefix: str, module: Any) -> dict[str, Any]:
        """``module``'s own parameters, made and initialised in a copy of it (the model's
        parameter objects stay as the optimizer holds them)."""
        torch = import_torch()
        scratch = copy.copy(module)  # its own parameters, not its children's, are made
        scratch._parameters = {
            k: None if p is None else torch.nn.Parameter(
                torch.full(p.shape, float("nan"), dtype=p.dtype, device=self._device),
                requires_grad=p.requires_grad)
            for k, p in module._parameters.items()
        }  # fmt: skip
        scratch._modules = {}
        init = getattr(self._model, "_init_weights", None)
        on_gpu = [self._device] if self._device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=on_gpu):
            torch.manual_seed(self._seed + self._index[id(module)])
            if callable(getattr(scratch, "reset_parameters", None)):
                scratch.reset_parameters()
            if callable(init):
                init(scratch)
        made = {}
        for local, p in scratch._parameters.items():
            if p is None:
                continue
            name = f"{prefix}.{local}" if prefix else local
            if p.is_floating_point() and bool(torch.isnan(p).any()):
                raise InvalidRequestError(
                    f"{name} ({type(module).__name__}) is set by neither its module's "
                    "reset_parameters() nor the model's _init_weights: give the model a "
                    "checkpoint (weights_from=), or build it where it can be initialised"
                )
            made[name] = p.detach()
        return made
