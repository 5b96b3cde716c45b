"""Training with optimizer state on a host tier, on the GPU machine, side by side in one
run: all in HBM, pycxl ``offload_model`` with the blocks' weights resident (the update
split between CPU and GPU; at ``step()``, and begun in the backward pass with
``update_in_backward``) and with them streamed from the tier (the model built on the
CPU, as one larger than HBM must be), pycxl ``offload_layers`` (weights streamed, each
layer updated as its gradients arrive), DeepSpeed ZeRO-2 with the optimizer offloaded to
the CPU (ZeRO-Offload) and ZeRO-3 with parameters and optimizer offloaded; then the CPU
Adam step alone: pycxl's fused loop, DeepSpeed's ``DeepSpeedCPUAdam`` and PyTorch's fused
CPU Adam on the same parameters.

    python3 benchmarks/train_offload_vs_deepspeed.py --tier dram0 [--steps 20]

Model: a randomly initialised Hugging Face Llama (16 layers of hidden 2048, intermediate
5632, vocab 32000: 953 M parameters) in bf16 with fp32 master weights, AdamW (lr 1e-4,
weight decay 0.01), 4 x 1024 random tokens a step, the same seed and data for all. Each
configuration runs in a process of its own; a step is the time from one loss to the next
(each step reads its loss; nothing waits for the whole device between steps, as in a
training loop: pycxl's updates run beside the next forward pass); its step time is the
median over each of three rounds of the steps after two warm-up steps, and the table
gives the median of the rounds (and their range), the mean over the timed steps with
everything they started finished (the last update waited for), the peak GPU memory and
the losses.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

CONFIGS = (
    "hbm",
    "pycxl-resident",
    "pycxl-resident-backward",
    "pycxl-model-stream",
    "pycxl-model-stream-backward",
    "pycxl-stream",
    "deepspeed-zero2",
    "deepspeed-zero3",
)
# offload_model's knobs, tried beside its defaults (not in the default list): half the
# socket's CPUs for the CPU step (they leave the host's memory to the GPU side's copies),
# a ring two blocks ahead
VARIANTS = ("pycxl-resident-half-cpus", "pycxl-model-stream-lookahead2")
LR, WEIGHT_DECAY = 1e-4, 0.01


def llama(dtype: Any, device: str) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype)


def batches(steps: int) -> list[Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 32000, (4, 1024), generator=g) for _ in range(steps)]


def run_config(name: str, tier: str, steps: int) -> dict[str, Any]:
    import functools

    import torch

    import pycxl

    data = batches(steps)
    node = pycxl.snapshot(gpus=False).resolve(tier).node
    extra: dict[str, Any] = {}
    if name.startswith("deepspeed"):
        import deepspeed

        for k, v in (
            ("RANK", "0"),
            ("LOCAL_RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29511"),
        ):
            os.environ.setdefault(k, v)
        zero: dict[str, Any] = {
            "stage": 2 if name.endswith("2") else 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
        }
        if name.endswith("3"):
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        config = {
            "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 1,
            "bf16": {"enabled": True},
            "zero_optimization": zero,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY}},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        model = llama(torch.float32, "cpu")
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config
        )

        def step(x: Any) -> float:
            x = x.to(engine.device)
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            return float(loss)
    else:
        streamed = name.startswith("pycxl-model-stream")
        model = llama(torch.bfloat16, "cpu" if streamed else "cuda")
        if name == "hbm":
            params = list(model.parameters())
            masters = [p.detach().float().requires_grad_() for p in params]
            opt = torch.optim.AdamW(masters, lr=LR, weight_decay=WEIGHT_DECAY, fused=True)

            def update() -> None:
                for m, p in zip(masters, params, strict=True):
                    m.grad = p.grad.float()
                    p.grad = None
                opt.step()
                for m, p in zip(masters, params, strict=True):
                    p.data.copy_(m)
                    m.grad = None
        elif name.startswith(("pycxl-resident", "pycxl-model-stream")):
            knobs: dict[str, Any] = {}
            if name.endswith("half-cpus"):
                s = pycxl.snapshot(gpus=False)
                near = s.nearest_cpu_node(node).node.cpus
                knobs["cpus"] = [c for c in near if c in os.sched_getaffinity(0)][: len(near) // 2]
            if name.endswith("lookahead2"):
                knobs["lookahead"] = 2
            if name.endswith("backward"):  # the loop steps after each backward pass
                knobs["update_in_backward"] = True
            off = pycxl.offload_model(
                model,
                tier,
                "gpu0",
                weights="stream" if streamed else "resident",
                optimizer=torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY),
                **knobs,
            )
            extra["plan_first"] = str(off.plan())

            def update() -> None:
                off.optimizer.step()
                off.optimizer.zero_grad()
        else:  # pycxl-stream: the blocks streamed, the rest with fp32 masters in HBM
            blocks = model.model.layers
            in_blocks = {id(p) for p in blocks.parameters()}
            rest = [p for p in model.parameters() if id(p) not in in_blocks]
            off = pycxl.offload_layers(
                blocks,
                tier,
                "gpu0",
                weights="stream",
                optimizer=functools.partial(torch.optim.AdamW, lr=LR, weight_decay=WEIGHT_DECAY),
            )
            masters = [p.detach().float().requires_grad_() for p in rest]
            opt = torch.optim.AdamW(masters, lr=LR, weight_decay=WEIGHT_DECAY, fused=True)

            def update() -> None:
                for m, p in zip(masters, rest, strict=True):
                    m.grad = p.grad.float()
                    p.grad = None
                opt.step()
                for m, p in zip(masters, rest, strict=True):
                    p.data.copy_(m)

        def step(x: Any) -> float:
            x = x.cuda()
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            update()
            return float(loss)

    torch.cuda.reset_peak_memory_stats()
    losses: list[float] = []
    # a step is the time from one loss to the next, as a training loop sees it: each step
    # reads its loss (which waits for its forward and backward passes) and nothing waits
    # for the whole device between steps (pycxl's updates run beside the next forward)
    torch.cuda.synchronize()
    marks = [time.perf_counter()]
    for x in data:
        losses.append(step(x))
        marks.append(time.perf_counter())
    if name.startswith("pycxl-") and name != "pycxl-stream":
        off.synchronize()  # the last update, run beside a next step that never came
    torch.cuda.synchronize()
    times = [b - a for a, b in itertools.pairwise(marks)]
    # the mean over the timed steps with everything they started finished
    mean_s = (time.perf_counter() - marks[2]) / max(len(data) - 2, 1)
    if name.startswith(("pycxl-resident", "pycxl-model-stream")):
        extra["plan"] = str(off.plan())
        # each side's seconds after step() (CPU, GPU), the last three steps; the last
        # step's seconds on its blocks; the backward pass's seconds before step()
        extra["after_step_s"] = [tuple(round(x, 4) for x in t) for t in off.times.history][-3:]
        extra["side_s"] = (round(off.times.cpu_s, 4), round(off.times.gpu_s, 4))
        extra["head_s"] = round(off.times.head_s, 4)
        pages = off.pages_by_node()
        extra["pages"] = pages
        extra["on_tier"] = sum(n for k, n in pages.items() if k == node) / max(
            sum(pages.values()), 1
        )
    timed = times[2:]
    third = max(len(timed) // 3, 1)
    rounds = [
        statistics.median(timed[k * third : (k + 1) * third])
        for k in range(3)
        if timed[k * third :]
    ]
    return {
        "config": name,
        "rounds_s": rounds,
        "step_s": statistics.median(rounds),
        "mean_s": mean_s,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "losses": losses,
        **extra,
    }


def cpu_adam_rates(tier: str, params: int = 822_083_584) -> dict[str, float]:
    """Parameters per second of one Adam step over ``params`` fp32 parameters whose state
    is on the tier: pycxl's fused step (bf16 gradient in, bf16 weight out), DeepSpeed's
    CPU Adam (fp32 gradient, as ZeRO-Offload hands it), PyTorch's fused CPU AdamW."""
    import torch

    import pycxl
    from pycxl.torch.offload.adam import AdamSettings, CpuAdam

    s = pycxl.snapshot(gpus=False)
    node = s.resolve(tier).node
    cpus = [c for c in s.nearest_cpu_node(node).node.cpus if c in os.sched_getaffinity(0)]
    torch.set_num_threads(len(cpus))

    def tier_tensor(n: int, dtype: Any) -> Any:
        buf = pycxl.allocate(n * dtype.itemsize, tier)
        keep.append(buf)
        return torch.from_numpy(buf.array("uint8")).view(dtype)

    keep: list[Any] = []
    master, m, v = (tier_tensor(params, torch.float32).normal_() for _ in range(3))
    v.abs_()
    g16, w16 = tier_tensor(params, torch.bfloat16).normal_(), tier_tensor(params, torch.bfloat16)
    g32 = tier_tensor(params, torch.float32).normal_()
    out: dict[str, float] = {}
    adam = CpuAdam(cpus)
    settings = AdamSettings(LR, (0.9, 0.999), 1e-8, WEIGHT_DECAY, True, False)
    times = []
    for k in range(4):
        t0 = time.perf_counter()
        adam.step((master, m, v), g16, w16, k + 1, settings)
        times.append(time.perf_counter() - t0)
    out["pycxl"] = params / min(times[1:])
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        p = torch.nn.Parameter(master)
        p.grad = g32
        ds = DeepSpeedCPUAdam([p], lr=LR, weight_decay=WEIGHT_DECAY, adamw_mode=True)
        times = []
        for _ in range(4):
            t0 = time.perf_counter()
            ds.step()
            times.append(time.perf_counter() - t0)
        out["deepspeed"] = params / min(times[1:])
    except Exception as e:  # reported beside the figures
        out["deepspeed_error"] = f"{type(e).__name__}: {e}"  # type: ignore[assignment]
    p = torch.nn.Parameter(master)
    p.grad = g32
    opt = torch.optim.AdamW([p], lr=LR, weight_decay=WEIGHT_DECAY, fused=True)
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    out["torch_fused"] = params / min(times[1:])
    out["threads"] = len(cpus)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", default="dram0")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--config", choices=CONFIGS + VARIANTS, help="one configuration (a child)")
    ap.add_argument("--only", nargs="*", choices=CONFIGS + VARIANTS, default=list(CONFIGS))
    ap.add_argument("--skip-cpu-adam", action="store_true")
    args = ap.parse_args()
    if args.config:
        print("RESULT " + json.dumps(run_config(args.config, args.tier, args.steps)), flush=True)
        return 0
    results = []
    for name in args.only:
        cmd = [
            sys.executable,
            __file__,
            "--config",
            name,
            "--tier",
            args.tier,
            "--steps",
            str(args.steps),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"{name}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}", flush=True)
            continue
        r = json.loads(line[7:])
        results.append(r)
        print(
            f"{name}: {r['step_s'] * 1e3:.0f} ms "
            f"(rounds {[round(t * 1e3) for t in r['rounds_s']]}, mean {r['mean_s'] * 1e3:.0f}), "
            f"peak {r['peak_gib']:.1f} GiB, losses {[round(x, 4) for x in r['losses']]}",
            flush=True,
        )
        for k in ("plan_first", "plan", "after_step_s", "side_s", "head_s", "pages", "on_tier"):
            if k in r:
                print(f"  {k}: {r[k]}", flush=True)
    by = {r["config"]: r for r in results}
    if "hbm" in by:
        ref = by["hbm"]["losses"]
        for r in results:
            diff = max(abs(a - b) for a, b in zip(r["losses"], ref, strict=True))
            print(
                f"{r['config']}: step {r['step_s'] * 1e3:.0f} ms, "
                f"{r['step_s'] / by['hbm']['step_s']:.2f}x HBM, "
                f"max loss difference from HBM {diff:.4f}"
            )
    for mine, theirs in (
        ("pycxl-resident", "deepspeed-zero2"),
        ("pycxl-resident-backward", "deepspeed-zero2"),
        ("pycxl-model-stream", "deepspeed-zero3"),
        ("pycxl-model-stream-backward", "deepspeed-zero3"),
        ("pycxl-stream", "deepspeed-zero3"),
    ):
        if mine in by and theirs in by:
            print(f"{mine} vs {theirs}: {by[theirs]['step_s'] / by[mine]['step_s']:.2f}x faster")
    if not args.skip_cpu_adam:
        rates = cpu_adam_rates(args.tier)
        print(
            "CPU Adam step, parameters/s: "
            + ", ".join(
                f"{k} {v / 1e9:.2f} G" if isinstance(v, float) else f"{k} {v}"
                for k, v in rates.items()
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
