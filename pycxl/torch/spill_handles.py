"""cuBLAS's handle for autograd's backward thread, made while HBM has room.

cuBLAS makes a handle for each thread that runs a GEMM, with ``cudaMalloc``: outside
PyTorch's allocator, so outside the spill. The forward pass's thread makes its own at
the first GEMM, before the activations fill HBM; autograd's thread for the device makes
its own at the backward pass's first GEMM, when a step that outgrows HBM has filled it
(to the headroom, which loading kernels lazily also eats into), and cuBLAS then fails
inside (``CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)``). So the first
module call on a CUDA device (a global forward pre-hook: the script is unchanged) runs a
small backward pass there first: autograd's thread makes its handle, and PyTorch that
handle's workspace for the stream, while there is room. PyTorch keeps both for the
thread's life.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base._log import get_logger

log = get_logger("pycxl.spill")


@dataclass
class BackwardHandles:
    """The hook, until the first module call with gradients on a CUDA device (a process
    that trains on several devices gets the first one's)."""

    torch: Any
    handle: Any = None

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def __call__(self, module: Any, args: Any) -> None:
        torch = self.torch
        if not torch.is_grad_enabled():
            return  # no backward pass follows this call (inference, evaluation)
        device = _cuda_device(torch, module, args)
        if device is None:
            return
        if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
            return  # traced, not run: a later eager call makes them
        self.remove()
        try:
            with torch.autocast("cuda", enabled=False):
                w = torch.ones(64, 64, device=f"cuda:{device}", requires_grad=True)
                (w @ w).sum().backward()
        except RuntimeError as e:  # no room even now: the backward pass will say so itself
            log.info("could not make cuBLAS's handle for the backward pass on cuda:%d: %s",
                     device, e)  # fmt: skip
        else:
            log.info("cuBLAS's handle for autograd's thread on cuda:%d made", device)


def _cuda_device(torch: Any, module: Any, args: Any) -> int | None:
    """The CUDA device of the call: its module's first parameter, else its first tensor
    argument; None where neither is on a CUDA device."""
    first = next(module.parameters(recurse=True), None)
    if first is None:
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is None or not first.is_cuda:
        return None
    return int(first.device.index or 0)


def install(torch: Any) -> BackwardHandles:
    """Hook every module's forward call until the handle is made."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    hook = BackwardHandles(torch)
    hook.handle = register_module_forward_pre_hook(hook)
    return hook
