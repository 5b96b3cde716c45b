"""Train with the optimizer state on a memory tier you name: the ZeRO-Offload pattern.

    python3 examples/zero_offload.py --tier cxl0 [--layers 8] [--width 4096] [--steps 10]
    python3 examples/zero_offload.py --tier cxl0 --device cpu --layers 2 --width 64   # no GPU

The model's layers compute on the GPU in bf16. Adam's state for each layer -- fp32
master weights, first and second moments -- lives in host memory on ``--tier`` (a CXL
node, or DRAM), pinned and registered for the GPU with ``pycxl.pinned_tensor``, so it
never takes GPU memory. Each step, layer by layer (the last layer first, as backward
produces them): the gradient is copied to the host by DMA, Adam updates the master
weights there on the CPU, and the new weights are copied back by DMA while the next
layer's update runs. Step time is reported, with the time of each part.

With ``--device cpu`` (no GPU: the testbed) the same loop runs on the CPU: the state is
placed on the tier with ``pycxl.allocate`` (not pinned; there is no GPU to pin for).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import pycxl
from pycxl.numa.placement import pages_by_node


class Layer:
    """One linear layer: its working weights on the device, Adam's state on the tier."""

    def __init__(self, width: int, tier: str, device: str, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        init = torch.randn(width, width, generator=gen) / width**0.5
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        self.weight = init.to(device=device, dtype=dtype, copy=True).requires_grad_(True)
        shape = (width, width)
        self.master, self.m, self.v, self.grad = (_on_tier(shape, tier, device) for _ in range(4))
        self.master.copy_(init)
        self.m.zero_()
        self.v.zero_()


def _on_tier(shape: tuple[int, int], tier: str, device: str) -> torch.Tensor:
    if device == "cuda":
        return pycxl.pinned_tensor(shape, torch.float32, tier)
    buf = pycxl.allocate(shape[0] * shape[1] * 4, tier)
    return torch.from_numpy(buf.array("float32").reshape(shape))


def adam(layer: Layer, step: int, lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-8) -> None:  # fmt: skip
    """Adam on the CPU, in place, on the tier's memory."""
    g = layer.grad
    layer.m.mul_(b1).add_(g, alpha=1 - b1)
    layer.v.mul_(b2).addcmul_(g, g, value=1 - b2)
    m_hat = layer.m / (1 - b1**step)
    v_hat = layer.v / (1 - b2**step)
    layer.master.addcdiv_(m_hat, v_hat.sqrt_().add_(eps), value=-lr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", default="dram0", help="Where Adam's state lives: dram0, cxl0...")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: use --device cpu")
    node = pycxl.snapshot(gpus=False).resolve(a.tier).node
    layers = [Layer(a.width, a.tier, a.device, seed=i) for i in range(a.layers)]
    dtype = layers[0].weight.dtype
    x = torch.randn(a.batch, a.width, device=a.device, dtype=dtype)
    target = torch.randn(a.batch, a.width, device=a.device, dtype=dtype)
    parts: dict[str, list[float]] = {"step": [], "compute": [], "update": []}
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        h = x
        for layer in layers:
            h = torch.relu(h @ layer.weight)
        loss = torch.nn.functional.mse_loss(h.float(), target.float())
        loss.backward()
        if a.device == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        for layer in reversed(layers):  # as backward produces them: the last layer first
            assert layer.weight.grad is not None
            layer.grad.copy_(layer.weight.grad, non_blocking=a.device == "cuda")
            if a.device == "cuda":
                torch.cuda.current_stream().synchronize()  # the gradient is on the host
            adam(layer, step)
            with torch.no_grad():  # new weights to the device, while the next layer updates
                layer.weight.copy_(layer.master, non_blocking=a.device == "cuda")
            layer.weight.grad = None
        if a.device == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        parts["step"].append(t2 - t0)
        parts["compute"].append(t1 - t0)
        parts["update"].append(t2 - t1)
        print(f"step {step}: loss {loss.item():.4f}, {1e3 * (t2 - t0):.1f} ms", flush=True)
    state = 4 * a.layers * a.width * a.width * 4
    placed = pages_by_node(layers[0].master.detach().numpy())
    med = {k: 1e3 * statistics.median(v[1:] or v) for k, v in parts.items()}
    print(f"tier {a.tier} (node {node}), {a.device}: optimizer state {state / 2**20:.0f} MiB, "
          f"first layer's master weights on nodes {placed}")  # fmt: skip
    print(f"median step {med['step']:.1f} ms: compute {med['compute']:.1f} ms, offloaded "
          f"update (copies + CPU Adam) {med['update']:.1f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
