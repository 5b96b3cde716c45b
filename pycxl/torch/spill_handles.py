"""cuBLAS's handle for autograd's backward thread, made while HBM has room.

cuBLAS makes a handle for each thread that runs a GEMM, with ``cudaMalloc``: outside
PyTorch's allocator, so outside the spill. The forward pass's thread makes its own at
the first GEMM, before the activations fill HBM; autograd's thread for the device makes
its own at the backward pass's first GEMM, when a step that outgrows HBM has filled it
(to the headroom, which loading kernels lazily also eats into), and cuBLAS then fails
inside (``CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)``). So the first
module call with gradients on a CUDA device (a global forward pre-hook: the script is
unchanged) runs a small backward pass there first: autograd's thread makes its handle,
and PyTorch a workspace for it, while there is room.

Limits: cuBLAS only (a cuDNN handle is made the same way, and is not made ahead); the
first device only; a module compiled in place (``model.compile()``) is traced with the
hook, not run, so there the first eager module call makes it, maybe too late (said in a
warning where it fails), and the hook stays registered, done (its graph guards on the
hooks it saw: taking it out would compile the graph again). Until it fires, or the first
optimizer step ends it, every module call pays for a global hook (about 2 us; PyTorch
warns once of it beside ``torch.compile(module)``): an inference process, which never
calls a module with gradients, pays that throughout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..base._log import get_logger

log = get_logger("pycxl.spill")


@dataclass
class BackwardHandles:
    """The hook, until the first module call with gradients on a ``device_type`` device
    (a process that trains on several devices gets the first one's) or the first
    optimizer step (by then a backward pass has made the handle)."""

    torch: Any
    device_type: str = "cuda"  # whose backward thread it serves ("cpu" in tests)
    handles: list[Any] = field(default_factory=list)  # the forward hook's, the step's
    done: bool = False
    # torch.compile traced the hook into a graph, which guards on the hooks it saw:
    # removing it then would compile the graph again, so it stays, done
    traced: bool = False

    @property
    def installed(self) -> bool:
        """Whether it still waits to make the handle."""
        return bool(self.handles) and not self.done

    def remove(self) -> None:
        """Unhook both (not from inside an optimizer step's own hooks: the step is
        iterating over them)."""
        handles, self.handles = self.handles, []  # two threads may get here at once
        for h in handles:
            h.remove()

    def _finish(self, *, in_step: bool) -> None:
        self.done = True
        if self.traced:
            return
        if in_step:  # the step hook stays, done; the forward hook may go
            if self.handles:
                self.handles[0].remove()
        else:
            self.remove()

    def step_ended(self, *_: Any) -> None:
        """An optimizer step ended: a backward pass has made the handle by now."""
        if not self.done:
            self._finish(in_step=True)

    def __call__(self, module: Any, args: Any) -> None:
        torch = self.torch
        if torch.compiler.is_compiling():  # first: a state read while traced is guarded
            self.traced = True
            return  # traced, not run: a later eager call makes it
        if self.done or not torch.is_grad_enabled():
            return  # no backward pass follows this call (inference, evaluation)
        try:
            device = _device_of(torch, module, args, self.device_type)
            if device is None or not _runs_now(torch, self.device_type):
                return
            self._finish(in_step=False)
            warm_up(torch, device)
        except Exception as e:  # best effort: the script's own call goes on regardless
            first = (str(e).splitlines() or [""])[0][:200]
            log.warning("could not make cuBLAS's handle for autograd's thread (%s: %s): a "
                        "backward pass that finds HBM full may fail inside cuBLAS",
                        type(e).__name__, first)  # fmt: skip
        else:
            log.info("cuBLAS's handle for autograd's thread on %s made", device)


def warm_up(torch: Any, device: str) -> None:
    """A small backward pass on ``device``, in fp32, outside the caller's saved-tensor
    hooks (a non-reentrant checkpoint's would take it for the checkpointed function's and
    recompute that), autocast and function modes (which would see it)."""
    kind = torch.device(device).type
    with torch._C.DisableTorchFunction(), \
            torch.autograd.graph.saved_tensors_hooks(_same, _same), \
            torch.autocast(kind, enabled=False):  # fmt: skip
        w = torch.ones(64, 64, device=device, dtype=torch.float32, requires_grad=True)
        (w @ w).sum().backward()


def _same(t: Any) -> Any:
    return t


def _runs_now(torch: Any, device_type: str) -> bool:
    """Whether a backward pass made here runs now, as it would on its own: not while a
    graph is captured (CUDA graphs) or traced (``torch.jit.trace``), under a dispatch
    mode (fake tensors, FLOP counters), a functorch transform (``grad``, ``vmap``) or
    with saved-tensor hooks disabled, nor in inference mode. Function modes pass: the
    commonest, ``torch.set_default_device``'s, leaves a tensor given its device alone."""
    c = torch._C
    if c._get_tracing_state() is not None or c._are_functorch_transforms_active():
        return False
    if not c._autograd._saved_tensors_hooks_is_enabled() or torch.is_inference_mode_enabled():
        return False
    if torch.utils._python_dispatch._get_current_dispatch_mode() is not None:
        return False
    return not (device_type == "cuda" and torch.cuda.is_current_stream_capturing())


def _device_of(torch: Any, module: Any, args: Any, device_type: str) -> str | None:
    """The device of the call (its module's first parameter, else its first tensor
    argument) where it is a ``device_type`` one, else None."""
    first = next(iter(module.parameters()), None)
    if first is None:
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is None or first.device.type != device_type:
        return None
    return str(first.device) if first.device.index is not None else f"{device_type}:0"


def install(torch: Any, device_type: str = "cuda") -> BackwardHandles:
    """Hook every module's forward call (and every optimizer's step, which ends it)
    until the handle is made."""
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook

    hook = BackwardHandles(torch, device_type)
    hook.handles = [register_module_forward_pre_hook(hook),
                    register_optimizer_step_post_hook(hook.step_ended)]  # fmt: skip
    return hook
