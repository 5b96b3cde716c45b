"""Training with optimizer state on a host tier, on the GPU machine, with the loop people
write (AdamW with weight decay, ``clip_grad_norm_``, a warm-up scheduler, ``zero_grad``;
optionally gradient accumulation), side by side in one run: all in HBM, pycxl
``offload_model`` with the blocks' weights resident (the update split between CPU and
GPU; at ``step()``, and begun in the backward pass with ``update_in_backward``) and with
them streamed from the tier (the model built on the CPU, as one larger than HBM must
be), DeepSpeed ZeRO-2 with the optimizer offloaded (ZeRO-Offload), ZeRO-3 with
parameters and optimizer offloaded, ZeRO-3 with half the state updated on the GPU
(``ratio``), ZeRO-2 with ZenFlow, and ZeRO-3 SuperOffload (reported as failing where it
fails); then the CPU Adam step alone: pycxl's fused loop, DeepSpeed's
``DeepSpeedCPUAdam`` and PyTorch's fused CPU Adam on the same parameters.

    python3 benchmarks/train_offload_vs_deepspeed.py --tier dram0 [--steps 20] \
        [--clip 1.0] [--accumulation 4] [--model qwen3|llama]

Model: randomly initialised, in bf16 with fp32 master weights. ``qwen3`` (the default): a
decoder with grouped-query attention and per-head query/key norms (20 layers of hidden
2048, 16 query and 4 key-value heads of 128, intermediate 6144, vocab 32000: 1.10 B
parameters); ``llama``: 16 Llama layers of hidden 2048, intermediate 5632 (953 M).
AdamW (lr 1e-4, weight decay 0.01), clipping at ``--clip`` (0: none), a linear warm-up
over the first 5 steps (transformers' ``get_linear_schedule_with_warmup``), 4 x 1024
random tokens a micro-batch, the same seed and data for all. DeepSpeed clips with its
``gradient_clipping``, takes the same scheduler, and runs with its CPU threads bound as
its launcher's ``--bind_cores_to_rank`` binds them (one thread a physical core, the
process pinned to them). Each configuration runs in a process of its own; a step is the
time from one optimizer step's last loss to the next (each micro-batch reads its loss;
nothing waits for the whole device between steps, as in a training loop: pycxl's updates
run beside the next forward pass); its step time is the median over each of three rounds
of the steps after two warm-up steps, and the table gives the median of the rounds (and
their range), the mean over the timed steps with everything they started finished (the
last update waited for), the clip call's own time, the peak GPU memory, the losses and
the gradient norms against HBM's.
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
    "deepspeed-zero2",
    "deepspeed-zero3",
    "deepspeed-zero3-ratio",
    "deepspeed-zenflow",
    "deepspeed-superoffload",
)
# offload_model's knobs, tried beside its defaults (not in the default list): half the
# socket's CPUs for the CPU step, a ring two blocks ahead, and half the blocks' state in
# HBM (as DeepSpeed's ratio 0.5 keeps half of it on the GPU; streamed: their weights too)
VARIANTS = (
    "pycxl-resident-half-cpus",
    "pycxl-model-stream-lookahead2",
    "pycxl-resident-hbm10",
    "pycxl-model-stream-hbm10",
)
LR, WEIGHT_DECAY, WARMUP = 1e-4, 0.01, 5
TOKENS, BATCH = 1024, 4


def build_model(kind: str, dtype: Any, device: str) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "llama":
        cfg: Any = transformers.LlamaConfig(
            vocab_size=32000, hidden_size=2048, intermediate_size=5632,
            num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
            max_position_embeddings=2048, tie_word_embeddings=False,
        )  # fmt: skip
        cls: Any = transformers.LlamaForCausalLM
    else:
        cfg = transformers.Qwen3Config(
            vocab_size=32000, hidden_size=2048, intermediate_size=6144,
            num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=4,
            head_dim=128, max_position_embeddings=2048, tie_word_embeddings=False,
        )  # fmt: skip
        cls = transformers.Qwen3ForCausalLM
    cfg._attn_implementation = "sdpa"
    return cls(cfg).to(device=device, dtype=dtype)


def batches(count: int) -> list[Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 32000, (BATCH, TOKENS), generator=g) for _ in range(count)]


def physical_cores() -> list[int]:
    """One CPU of each physical core this process may run on, as DeepSpeed's launcher
    binds a rank's threads with ``--bind_cores_to_rank``."""
    seen, cores = set(), []
    for cpu in sorted(os.sched_getaffinity(0)):
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(base + "core_id") as f, open(base + "physical_package_id") as g:
                key = (f.read().strip(), g.read().strip())
        except OSError:
            key = (str(cpu), "")
        if key not in seen:
            seen.add(key)
            cores.append(cpu)
    return cores


def deepspeed_config(name: str, clip: float, accumulation: int) -> dict[str, Any]:
    offload: dict[str, Any] = {"device": "cpu", "pin_memory": True}
    zero: dict[str, Any] = {"stage": 3 if "zero3" in name or "superoffload" in name else 2}
    if name == "deepspeed-zero3":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if name == "deepspeed-zero3-ratio":
        offload["ratio"] = 0.5
    if name == "deepspeed-superoffload":
        offload.update(super_offload=True, cpuadam_cores_perc=0.8)
    if name == "deepspeed-zenflow":
        zero["zenflow"] = {
            "topk_ratio": 0.1, "update_interval": 4, "select_strategy": "auto",
            "select_interval": "auto", "overlap_step": True,
        }  # fmt: skip
    zero["offload_optimizer"] = offload
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": clip,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY}},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def run_config(name: str, args: argparse.Namespace) -> dict[str, Any]:
    if name.startswith("deepspeed"):  # as its launcher binds a rank, before torch loads
        cores = physical_cores()
        os.sched_setaffinity(0, cores)
        os.environ["OMP_NUM_THREADS"] = str(len(cores))
    import torch
    import transformers

    import pycxl

    acc, clip, steps = args.accumulation, args.clip, args.steps
    data = batches(steps * acc)
    node = pycxl.snapshot(gpus=False).resolve(args.tier).node
    extra: dict[str, Any] = {}

    def schedule(opt: Any) -> Any:
        return transformers.get_linear_schedule_with_warmup(opt, WARMUP, steps)

    clip_s: list[float] = []
    norms: list[Any] = []
    if name.startswith("deepspeed"):
        import deepspeed

        port = str(29500 + os.getpid() % 1000)  # a fresh one: the last may linger
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                     ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port)):  # fmt: skip
            os.environ.setdefault(k, v)
        model = build_model(args.model, torch.float32, "cpu")
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), lr_scheduler=schedule,
            config=deepspeed_config(name, clip, acc),
        )  # fmt: skip
        extra["threads"] = torch.get_num_threads()

        def step(xs: list[Any]) -> float:
            total = 0.0
            for x in xs:  # DeepSpeed divides by the accumulation steps itself
                x = x.to(engine.device)
                loss = engine(input_ids=x, labels=x).loss
                engine.backward(loss)
                engine.step()
                total += float(loss) / acc
            norms.append(engine.get_global_grad_norm())
            return total
    else:
        streamed = name.startswith("pycxl-model-stream")
        model = build_model(args.model, torch.bfloat16, "cpu" if streamed else "cuda")
        params = list(model.parameters())
        if name == "hbm":
            masters = [p.detach().float().requires_grad_() for p in params]
            opt = torch.optim.AdamW(masters, lr=LR, weight_decay=WEIGHT_DECAY, fused=True)
            sched = schedule(opt)

            def update() -> None:
                for m, p in zip(masters, params, strict=True):
                    m.grad = p.grad.float()
                    p.grad = None
                opt.step()
                sched.step()
                for m, p in zip(masters, params, strict=True):
                    p.data.copy_(m)
                    m.grad = None
        else:
            knobs: dict[str, Any] = {}
            if name.endswith("half-cpus"):
                s = pycxl.snapshot(gpus=False)
                near = s.nearest_cpu_node(node).node.cpus
                knobs["cpus"] = [c for c in near if c in os.sched_getaffinity(0)][: len(near) // 2]
            if name.endswith("lookahead2"):
                knobs["lookahead"] = 2
            if "-hbm" in name:
                knobs["hbm_blocks"] = int(name.rsplit("-hbm", 1)[1])
            if name.endswith("backward"):  # the update begins in the backward pass
                knobs["update_in_backward"] = True
            off = pycxl.offload_model(
                model, args.tier, "gpu0", weights="stream" if streamed else "resident",
                optimizer=torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY),
                **knobs,
            )  # fmt: skip
            extra["plan_first"] = str(off.plan())
            sched = schedule(off.optimizer)

            def update() -> None:
                off.optimizer.step()
                sched.step()
                off.optimizer.zero_grad()

        def step(xs: list[Any]) -> float:
            total = 0.0
            for x in xs:
                x = x.cuda()
                loss = model(input_ids=x, labels=x).loss / acc
                loss.backward()
                total += float(loss)
            if clip:
                t0 = time.perf_counter()
                norms.append(torch.nn.utils.clip_grad_norm_(params, clip))
                clip_s.append(time.perf_counter() - t0)
            update()
            return total

    torch.cuda.reset_peak_memory_stats()
    losses: list[float] = []
    # a step is the time from one loss to the next, as a training loop sees it: each
    # micro-batch reads its loss (which waits for its forward and backward passes) and
    # nothing waits for the whole device between steps
    torch.cuda.synchronize()
    marks = [time.perf_counter()]
    for k in range(steps):
        losses.append(step(data[k * acc : (k + 1) * acc]))
        marks.append(time.perf_counter())
    if name.startswith("pycxl-"):
        off.synchronize()  # the last update, run beside a next step that never came
    torch.cuda.synchronize()
    times = [b - a for a, b in itertools.pairwise(marks)]
    mean_s = (time.perf_counter() - marks[2]) / max(steps - 2, 1)
    if name.startswith("pycxl-"):
        extra["plan"] = str(off.plan())
        # each side's seconds after step() (CPU, GPU), the last three steps
        extra["after_step_s"] = [tuple(round(x, 4) for x in t) for t in off.times.history][-3:]
        extra["side_s"] = (round(off.times.cpu_s, 4), round(off.times.gpu_s, 4))
        pages = off.pages_by_node()
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
        "clip_ms": statistics.median(clip_s[2:] or clip_s or [float("nan")]) * 1e3,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "losses": losses,
        "norms": [float(n) if n is not None else float("nan") for n in norms],
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
    ap.add_argument("--clip", type=float, default=1.0, help="max gradient norm (0: none)")
    ap.add_argument("--accumulation", type=int, default=1, help="micro-batches a step")
    ap.add_argument("--model", choices=("qwen3", "llama"), default="qwen3")
    ap.add_argument("--config", choices=CONFIGS + VARIANTS, help="one configuration (a child)")
    ap.add_argument("--only", nargs="*", choices=CONFIGS + VARIANTS, default=list(CONFIGS))
    ap.add_argument("--child-timeout", type=float, default=600.0)
    ap.add_argument("--skip-cpu-adam", action="store_true")
    args = ap.parse_args()
    if args.config:
        print("RESULT " + json.dumps(run_config(args.config, args)), flush=True)
        return 0
    print(
        f"model {args.model}, {args.steps} steps of {args.accumulation} x {BATCH} x {TOKENS} "
        f"tokens, clip {args.clip or 'off'}, tier {args.tier}",
        flush=True,
    )
    results = []
    for name in args.only:
        cmd = [sys.executable, __file__, "--config", name, "--tier", args.tier,
               "--steps", str(args.steps), "--clip", str(args.clip),
               "--accumulation", str(args.accumulation), "--model", args.model]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.child_timeout)
        except subprocess.TimeoutExpired as e:
            tail = (e.stderr or b"")[-2000:]
            print(f"{name}: failed (no result in {args.child_timeout:.0f} s)\n{tail!r}", flush=True)
            continue
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"{name}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}", flush=True)
            continue
        r = json.loads(line[7:])
        results.append(r)
        print(
            f"{name}: {r['step_s'] * 1e3:.0f} ms "
            f"(rounds {[round(t * 1e3) for t in r['rounds_s']]}, mean {r['mean_s'] * 1e3:.0f}), "
            f"clip {r['clip_ms']:.1f} ms, peak {r['peak_gib']:.1f} GiB, "
            f"losses {[round(x, 4) for x in r['losses']]}",
            flush=True,
        )
        for k in ("plan_first", "plan", "after_step_s", "side_s", "on_tier", "threads"):
            if k in r:
                print(f"  {k}: {r[k]}", flush=True)
    by = {r["config"]: r for r in results}
    if "hbm" in by:
        ref, ref_norms = by["hbm"]["losses"], by["hbm"]["norms"]
        if args.clip:
            # a speculative update (begun before the norm is known, undone where the clip
            # cuts) wins only where the clip seldom cuts: say how often it cut here
            cut = sum(n > args.clip for n in ref_norms)
            print(
                f"HBM gradient norms {[round(n, 3) for n in ref_norms]}: the clip at "
                f"{args.clip} cut {cut} of {len(ref_norms)} steps"
            )
        for r in results:
            diff = max(abs(a - b) for a, b in zip(r["losses"], ref, strict=True))
            gap = max(
                (abs(a - b) / max(b, 1e-12) for a, b in zip(r["norms"], ref_norms, strict=False)),
                default=float("nan"),
            )
            print(
                f"{r['config']}: step {r['step_s'] * 1e3:.0f} ms, mean {r['mean_s'] * 1e3:.0f} ms, "
                f"{r['step_s'] / by['hbm']['step_s']:.2f}x HBM, "
                f"max loss difference from HBM {diff:.4f}, final loss {r['losses'][-1]:.4f} "
                f"(HBM {ref[-1]:.4f}), max norm difference {gap:.2%}"
            )
    for mine in ("pycxl-resident", "pycxl-resident-backward", "pycxl-model-stream",
                 "pycxl-model-stream-backward", "pycxl-resident-hbm10",
                 "pycxl-model-stream-hbm10"):  # fmt: skip
        for theirs in ("deepspeed-zero2", "deepspeed-zero3", "deepspeed-zero3-ratio",
                       "deepspeed-zenflow", "deepspeed-superoffload"):  # fmt: skip
            if mine in by and theirs in by:
                a, b = by[mine], by[theirs]
                print(
                    f"{mine} vs {theirs}: {b['step_s'] / a['step_s']:.2f}x faster by median, "
                    f"{b['mean_s'] / a['mean_s']:.2f}x by mean"
                )
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
