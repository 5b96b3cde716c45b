"""Train with the optimizer state on a memory tier you name: the ZeRO-Offload pattern.

    python3 examples/zero_offload.py --tier cxl0 [--layers 8] [--width 4096] [--steps 10]
    python3 examples/zero_offload.py --tier cxl0 --device cpu --layers 2 --width 64   # no GPU

The model's layers compute on the GPU in bf16. Adam's state for each layer -- fp32
master weights, first and second moments -- lives in host memory on ``--tier`` (a CXL
node, or DRAM) and never takes GPU memory: ``pycxl.offload_layers(..., weights=
"resident", optimizer=...)``. As soon as the backward pass has produced a layer's
gradients (the last layer first), they are copied to pinned memory on the tier, and a
worker thread runs PyTorch's fused CPU Adam for that layer while the GPU goes on with
the layers before it; the new weights are copied back before the layer runs again.

``--mode serial`` runs the same training the way it is often written by hand: after the
backward pass, layer by layer, copy the gradient to the host, wait, run Adam (PyTorch
ops, unfused), copy the weights back. Step time is reported with its parts, and the
bound of this model: the CPU update alone (conversions and fused Adam over every
layer's state on the tier, nothing else running), measured in the same run.

With ``--device cpu`` (no GPU: the testbed) the same loop runs on the CPU: the
parameters and Adam's state live on the tier and are updated there in place.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from typing import Any

import torch

import pycxl
from pycxl.numa.placement import pages_by_node


def build(layers: int, width: int, device: str) -> list[torch.nn.Linear]:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    return [torch.nn.Linear(width, width, bias=False, device=device, dtype=dtype)
            for _ in range(layers)]  # fmt: skip


def forward_backward(model: list[torch.nn.Linear], x: torch.Tensor, target: torch.Tensor) -> float:
    h = x
    for layer in model:
        h = torch.relu(layer(h))
    loss = torch.nn.functional.mse_loss(h.float(), target.float())
    loss.backward()
    return float(loss.detach())


class Serial:
    """The hand-written loop: Adam's state on the tier (pinned), everything in turn."""

    def __init__(self, model: list[torch.nn.Linear], tier: str) -> None:
        self.model = model
        self.state = []
        for layer in model:
            shape = tuple(layer.weight.shape)
            master, m, v, g = (pycxl.pinned_tensor(shape, torch.float32, tier) for _ in range(4))
            master.copy_(layer.weight.detach())
            m.zero_()
            v.zero_()
            self.state.append((master, m, v, g))
        self.step_count = 0

    def step(self, lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999,
             eps: float = 1e-8) -> None:  # fmt: skip
        self.step_count += 1
        t = self.step_count
        for layer, (master, m, v, g) in zip(reversed(self.model), reversed(self.state),
                                            strict=True):  # fmt: skip
            assert layer.weight.grad is not None
            g.copy_(layer.weight.grad, non_blocking=True)
            torch.cuda.current_stream().synchronize()  # the gradient is on the host
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            m_hat = m / (1 - b1**t)
            v_hat = v / (1 - b2**t)
            master.addcdiv_(m_hat, v_hat.sqrt_().add_(eps), value=-lr)
            with torch.no_grad():
                layer.weight.copy_(master, non_blocking=True)
            layer.weight.grad = None
        torch.cuda.synchronize()

    def host_tensors(self) -> list[Any]:
        return [t for group in self.state for t in group]


def update_bound(layers: int, width: int, tier: str, device: str, rounds: int = 5) -> float:
    """Seconds of the CPU's share of one step, alone: per layer, the gradient from the
    layer's dtype to fp32, fused Adam on fp32 state on the tier, the master back."""
    shape = (layers, width, width)
    state = [pycxl.allocate(layers * width * width * 4, tier).array("float32").reshape(shape)
             for _ in range(4)]  # fmt: skip
    master, grad, m, v = (torch.from_numpy(a) for a in state)
    low = torch.bfloat16 if device == "cuda" else torch.float32
    grad16 = torch.zeros(shape, dtype=low)
    weights16 = torch.zeros(shape, dtype=low)
    params = [torch.nn.Parameter(master[i]) for i in range(layers)]
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    for i, p in enumerate(params):
        opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": m[i].zero_(),
                        "exp_avg_sq": v[i].zero_()}  # fmt: skip
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i, p in enumerate(params):
            if low != torch.float32:
                grad[i].copy_(grad16[i])
            p.grad = grad[i]
            opt.step()  # one layer's state: the update runs layer by layer
            p.grad = None
            if low != torch.float32:
                weights16[i].copy_(p.detach())
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:] or times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", default="dram0", help="Where Adam's state lives: dram0, cxl0...")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--mode", choices=["overlap", "serial"], default="overlap")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: use --device cpu")
    if a.device == "cpu" and a.mode == "serial":
        sys.exit("--mode serial copies to and from a GPU: use --device cuda")
    node = pycxl.snapshot(gpus=False).resolve(a.tier).node
    model = build(a.layers, a.width, a.device)
    dtype = model[0].weight.dtype
    x = torch.randn(a.batch, a.width, device=a.device, dtype=dtype)
    target = torch.randn(a.batch, a.width, device=a.device, dtype=dtype)
    adam = functools.partial(torch.optim.Adam, lr=1e-3, fused=True)
    offload: Any = None
    serial: Serial | None = None
    if a.mode == "overlap":
        offload = pycxl.offload_layers(model, a.tier, "gpu0" if a.device == "cuda" else None,
                                       weights="resident", optimizer=adam)  # fmt: skip
    else:
        serial = Serial(model, a.tier)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    parts: dict[str, list[float]] = {"step": [], "forward+backward": [], "update": []}
    start = time.perf_counter()
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        loss = forward_backward(model, x, target)  # float(): the loss is on the host
        sync()
        t1 = time.perf_counter()
        if serial is not None:
            serial.step()
        t2 = time.perf_counter()
        parts["forward+backward"].append(t1 - t0)
        parts["update"].append(t2 - t1)
        parts["step"].append(t2 - start)  # from one step's start to the next's
        start = t2
        print(f"step {step}: loss {loss:.4f}, {1e3 * (t2 - t0):.1f} ms", flush=True)
    if offload is not None:
        offload.synchronize()
    tensors = offload.host_tensors() if offload is not None else serial.host_tensors()  # type: ignore[union-attr]
    placed: dict[int, int] = {}
    for t in tensors:
        for n, count in pages_by_node(t).items():
            placed[n] = placed.get(n, 0) + count
    on_tier = sum(placed.values()) * 4096
    med = {k: 1e3 * statistics.median(v[1:] or v) for k, v in parts.items()}
    bound = 1e3 * update_bound(a.layers, a.width, a.tier, a.device)
    print(f"tier {a.tier} (node {node}), {a.device}, {a.mode}: {on_tier / 2**20:.0f} MiB of "
          f"host memory for the optimizer, pages per node {placed}")  # fmt: skip
    if a.mode == "overlap":
        waited = offload.stats().update_wait_s / a.steps * 1e3
        print(f"median step {med['step']:.1f} ms: forward+backward {med['forward+backward']:.1f}"
              f" ms (of it, waiting for updates {waited:.1f} ms per step); CPU update alone "
              f"{bound:.1f} ms: step / bound {med['step'] / bound:.2f}")  # fmt: skip
    else:
        print(f"median step {med['step']:.1f} ms: forward+backward {med['forward+backward']:.1f}"
              f" ms, offloaded update (copies + CPU Adam) {med['update']:.1f} ms; CPU update "
              f"alone {bound:.1f} ms: step / bound {med['step'] / bound:.2f}")  # fmt: skip
    if offload is not None:
        offload.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
