"""``offload_layers``' optimizer: each layer's own Adam or AdamW whose fp32 master
weights and moments live on the tier, and its step, run on the CPU (the fused step of
adam.py where it runs the settings, else PyTorch's) while the GPU goes on."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ...base.errors import InvalidRequestError
from ...gpu.engine import CopyBack
from .._import import import_torch
from .adam import AdamSettings, CpuAdam
from .layout import Block, piece

# (elements, dtype, pinned) -> a typed host tensor on the tier
TypedAlloc = Callable[[int, Any, bool], Any]


@dataclass
class LayerUpdate:
    """One layer's optimizer (its state on the tier) and its step in flight."""

    optimizer: Any
    masters: list[Any]  # fp32 parameters the optimizer updates (views of tier memory)
    master_grads: list[Any]  # their gradients, fp32 (empty: the layer's parameters' own)
    pending: Future[None] | None = None  # the optimizer step in flight
    updated: Any = None  # device event: the new weights are on the device (resident)
    copies: list[CopyBack] = field(default_factory=list)  # gradients on their way home
    took: list[int] = field(default_factory=list)  # took a gradient this pass (resident)

    @classmethod
    def placed(
        cls, B: Block, factory: Callable[[list[Any]], Any], alloc: TypedAlloc,
        *, params_on_tier: bool,
    ) -> LayerUpdate:  # fmt: skip
        """``B``'s optimizer made by ``factory`` over fp32 masters on the tier: the
        host weights themselves where they are fp32, else copies; its moments zeroed
        on the tier. ``params_on_tier``: the optimizer reads the parameters' own
        gradients (the CPU, resident)."""
        torch = import_torch()

        def views(flat: Any) -> list[Any]:
            return [piece(flat, p).view(p.shape) for p in B.params]

        if B.dtype == torch.float32:  # the host copy of the weights is the master copy
            masters = views(B.weights)
            master_grads = views(B.grads) if B.grads is not None else []
        else:
            masters = views(alloc(B.numel, torch.float32, False))
            master_grads = views(alloc(B.numel, torch.float32, False))
            with torch.no_grad():
                for m, w in zip(masters, views(B.weights), strict=True):
                    m.copy_(w)
        if params_on_tier:
            master_grads = []
        params = [torch.nn.Parameter(m, requires_grad=True) for m in masters]
        opt = factory(params)
        if not isinstance(opt, torch.optim.Adam | torch.optim.AdamW):
            raise InvalidRequestError(
                f"optimizer {type(opt).__name__}: the state of Adam and AdamW is placed on "
                "the tier; other optimizers would keep theirs in ordinary memory"
            )
        amsgrad = any(g.get("amsgrad") for g in opt.param_groups)
        moments = [views(alloc(B.numel, torch.float32, False)) for _ in range(3 if amsgrad else 2)]
        for k, m in enumerate(params):
            st: dict[str, Any] = {
                "step": torch.tensor(0.0, dtype=torch.float32),
                "exp_avg": moments[0][k].zero_(),
                "exp_avg_sq": moments[1][k].zero_(),
            }
            if amsgrad:
                st["max_exp_avg_sq"] = moments[2][k].zero_()
            opt.state[m] = st
        return cls(opt, params, master_grads)

    def fused_settings(self) -> AdamSettings | None:
        """The settings for the fused CPU step, or None where it does not run them
        (amsgrad, several groups)."""
        opt = self.optimizer
        if len(opt.param_groups) != 1:
            return None
        try:
            return AdamSettings.of(opt, opt.param_groups[0])
        except InvalidRequestError:
            return None

    def step(
        self, grads: list[Any], weights: list[Any], fused: CpuAdam | None, which: list[int]
    ) -> None:
        """One step of the parameters ``which`` (positions) from ``grads`` (landed, one
        per master), writing the new weights into ``weights`` (the layer's dtype; the
        masters themselves where fp32). The others take no step, as torch's Adam skips a
        parameter without a gradient."""
        torch = import_torch()
        settings = self.fused_settings() if fused is not None else None
        with torch.no_grad():
            if fused is not None and settings is not None:
                self._fused_step(grads, weights, fused, settings, which)
            else:
                self._torch_step(grads, weights, which)

    def _fused_step(
        self, grads: list[Any], weights: list[Any], fused: CpuAdam, settings: AdamSettings,
        which: list[int],
    ) -> None:  # fmt: skip
        """One pass per parameter: the gradient, the master and moments on the tier,
        and the weight in the layer's dtype."""
        for j in which:
            master, grad, weight = self.masters[j], grads[j], weights[j]
            st = self.optimizer.state[master]
            st["step"] += 1
            out = None if weight.data_ptr() == master.data_ptr() else weight.view(-1)
            state = (master.data.view(-1), st["exp_avg"].view(-1), st["exp_avg_sq"].view(-1))
            fused.step(state, grad.contiguous().view(-1), out, int(st["step"].item()), settings)

    def _torch_step(self, grads: list[Any], weights: list[Any], which: list[int]) -> None:
        torch = import_torch()
        for k in which:
            m, g = self.masters[k], grads[k]
            if self.master_grads:  # gradients landed in host memory on the tier
                mg = self.master_grads[k]
                if mg.data_ptr() != g.data_ptr():
                    mg.copy_(g)
                m.grad = mg
            else:
                m.grad = g if g.dtype == torch.float32 else g.float()
        self.optimizer.step()
        for m, w in zip(self.masters, weights, strict=True):
            m.grad = None
            if m.data_ptr() != w.data_ptr():
                w.copy_(m)  # fp32 master -> the layer's dtype

    def tensors(self) -> list[Any]:
        """Its host tensors on the tier: masters, their gradients, moments."""
        out = [*self.masters, *self.master_grads]
        for st in self.optimizer.state.values():
            out += [v for key, v in st.items() if key != "step"]
        return out
