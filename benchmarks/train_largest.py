"""The largest model one GPU box trains: a Llama-shaped decoder (13 B by default: 40 layers,
hidden 5120, intermediate 13824, vocab 32000) placed as ``pycxl.fit`` places it (weights
resident or streamed, activation checkpointing where HBM is short, as many blocks' state
in HBM as it holds beside the step, the rest on the tier), then trained with the loop
people write (AdamW, clip 1.0, a warm-up scheduler) for ``--steps`` steps. Printed: fit's
placement and bound, the step (median after two), tokens/s, model FLOPs utilisation
against ``--peak-tflops``, the measured step against fit's bound, peak HBM, the host's
resident memory, and the losses.

The model is built where it lives: resident, on the GPU in bf16 (nothing of it on the
host); streamed, on the ``meta`` device, and ``offload_model(initialise=True)`` makes each
module by the model's own initialisation on the GPU and takes its values where they live
(the blocks' weights on the tier, the rest on the GPU: a 10.5 B model built on the host
took 292 s of the CPU's random numbers). Each run is one process.

``--slice K`` checks the losses instead: the model's first K blocks, placed as fit placed
the whole (at least one block's state on the tier), trained with pycxl, against the same
slice trained in HBM in fp32 (autocast to bf16) from the same bf16 start, data and loop.

``--deepspeed RATIO [RATIO...]`` trains the same model, data and loop under DeepSpeed
ZeRO-3 instead, built inside ``deepspeed.zero.Init`` (as transformers builds a model too
large for one copy), with activation checkpointing and its threads bound as its launcher binds them:
RATIO 1 offloads the parameters and the optimizer to the CPU (ZeRO-3 offload); below 1,
the parameters stay on the GPU and that fraction of the optimizer state is offloaded
(DeepSpeed's ``ratio``), the rest updated on the GPU. Each ratio runs in a process of
its own; where one fails (out of host or GPU memory, the OOM killer included) that is
printed, and the fastest that ran is named (exit status 1 where none ran).

    python3 benchmarks/train_largest.py --tier dram0                 # 13 B on the GPU machine
    python3 benchmarks/train_largest.py --slice 4                    # losses against fp32
    python3 benchmarks/train_largest.py --largest --steps 4          # the most blocks here
    python3 benchmarks/train_largest.py --deepspeed 1 0.5 0.25       # DeepSpeed, same model
    python3 benchmarks/train_largest.py --layers 2 --hidden 256 --intermediate 512 \\
        --vocab 1000 --tokens 64 --gpu none --hbm-free 4G           # a smoke run, no GPU
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

LR, WEIGHT_DECAY, WARMUP = 1e-4, 0.01, 3
PHASES: dict[str, int] = {}  # peak HBM allocated: set-up, the first forward and backward
CHILD = "TRAIN_LARGEST_CHILD"  # the ratio, in the child that runs DeepSpeed
STEP = re.compile(r"^DeepSpeed ZeRO-3, ratio [\d.]+: .* step (\d+) ms")


def build(args: argparse.Namespace, device: str | None) -> Any:
    """The decoder in bf16, made on ``device`` directly (no fp32 copy anywhere); ``None``:
    where the current context (``deepspeed.zero.Init``) makes it."""
    import torch
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 128),
        num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=args.tokens,
        tie_word_embeddings=False,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        if device is None:
            return transformers.LlamaForCausalLM(cfg)
        with torch.device(device):
            return transformers.LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(before)


def deepspeed_engine(args: argparse.Namespace, schedule: Any) -> Any:
    """The model built partitioned under ZeRO-3 and its engine, as ``--deepspeed`` asks."""
    import deepspeed
    import torch

    port = str(29500 + os.getpid() % 1000)  # a fresh one: the last may linger
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port)):  # fmt: skip
        os.environ.setdefault(k, v)
    optimizer: dict[str, Any] = {"device": "cpu", "pin_memory": True}
    zero: dict[str, Any] = {"stage": 3, "offload_optimizer": optimizer}
    if args.deepspeed >= 1:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    else:
        optimizer["ratio"] = args.deepspeed
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_clipping": args.clip,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY}},
        "steps_per_print": 10**9,
    }
    deepspeed.init_distributed(dist_backend="nccl")
    with deepspeed.zero.Init(config_dict_or_path=config, dtype=torch.bfloat16):
        model = build(args, None)  # zero.Init places each parameter as it is made
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), lr_scheduler=schedule, config=config
    )
    return engine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", default="dram0")
    ap.add_argument("--gpu", default="gpu0", help="'none': train on the CPU (a smoke run)")
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--intermediate", type=int, default=13824)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--tokens", type=int, default=4096, help="one sequence of this many")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--hbm-free", help="plan for this much HBM (no GPU here: required)")
    ap.add_argument("--tier-free", help="plan for this much free on the tier (default: read)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense bf16")
    ap.add_argument("--weights", choices=("resident", "stream"),
                    help="the fastest placement of these weights that fits")  # fmt: skip
    ap.add_argument("--slice", type=int, metavar="K",
                    help="check the losses instead: the first K blocks, placed as fit placed "
                    "the whole model, against the same slice trained in HBM in fp32")  # fmt: skip
    ap.add_argument("--largest", action="store_true",
                    help="train the most blocks of this shape that fit here (fit's answer, "
                    "from this machine's free memory and rates)")  # fmt: skip
    ap.add_argument("--deepspeed", type=float, nargs="+", metavar="RATIO",
                    help="DeepSpeed ZeRO-3 instead, at each RATIO in turn")  # fmt: skip
    args = ap.parse_args()
    if args.deepspeed is not None:
        if os.environ.get(CHILD):
            args.deepspeed = float(os.environ[CHILD])
            return train_deepspeed(args)
        return deepspeed_in_children(args)

    import pycxl

    gpu = None if args.gpu == "none" else args.gpu
    shape = model_shape(args)
    plan = pycxl.fit(shape, args.tier, gpu, tokens=args.tokens, hbm_free=args.hbm_free,
                     tier_free=args.tier_free)  # fmt: skip
    if args.largest:
        plan = most_layers(args, plan)
        shape = plan.shape
    print(plan.why, flush=True)
    chosen = plan.chosen
    if args.weights is not None:  # the fastest of those asked for (options: best first)
        chosen = next((o for o in plan.options if o.fits and o.weights == args.weights), None)
        said = "none fits" if chosen is None else f"{chosen.name}, {chosen.bound}"
        print(f"asked for weights {args.weights}: {said}", flush=True)
    if chosen is None:
        return 8
    if args.slice is not None:
        return check_slice(args, chosen, gpu)
    streamed = chosen.weights == "stream"
    device = "meta" if streamed else "cpu" if gpu is None else "cuda"
    t0 = time.perf_counter()
    model = build(args, device)
    checkpointed = checkpoint_first(model, chosen.checkpointed_blocks)
    t1 = time.perf_counter()
    print(f"model built on {device} in {t1 - t0:.0f} s", flush=True)
    held = chosen.hbm_blocks if gpu is not None else 0  # no GPU here: no HBM to hold state
    off, step = offloaded_step(model, args, chosen.weights, held, gpu)
    print(f"offload_model set up in {time.perf_counter() - t1:.0f} s", flush=True)
    print(off.plan(), flush=True)
    if gpu is not None:  # what is held before the first step, against fit's parts
        import torch

        parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in chosen.hbm.items())
        print(f"HBM allocated after set-up {torch.cuda.memory_allocated() / 2**30:.2f} GiB; "
              f"fit's parts (GiB): {parts}", flush=True)  # fmt: skip
    losses, times = train(step, args, "cuda" if gpu is not None else "cpu")
    off.synchronize()
    name = f"pycxl, weights {chosen.name}, hbm_blocks {held}"
    step_s, peak = report(name, shape, args, losses, times, checkpointed, gpu is not None)
    if chosen.step_s:
        print(
            f"fit's bound {chosen.step_s * 1e3:.0f} ms: measured {step_s / chosen.step_s:.2f}x it"
        )
    # fit's bytes against what the run held: HBM's peak allocated (fit's parts that
    # PyTorch allocates: not the CUDA context nor the headroom it leaves), the tier's
    # pages now
    on_tier = sum(off.pages_by_node().values()) * resource.getpagesize()
    allocated = {k: v for k, v in chosen.hbm.items() if k not in ("cuda_context", "headroom")}
    if PHASES:
        import torch

        rest = torch.cuda.max_memory_allocated()
        print("peak HBM allocated (GiB): " + ", ".join(
            f"{k} {v / 2**30:.2f}" for k, v in [*PHASES.items(), ("after", rest)]))  # fmt: skip
    for where, said, had in (("HBM", allocated, peak), ("tier", chosen.tier, on_tier)):
        said_b = sum(said.values())
        ratio = f"{had / said_b:.3f}x" if said_b else "-"
        print(f"fit's {where} {said_b / 2**30:.2f} GiB, held {had / 2**30:.2f} GiB: {ratio}")
    t = off.times
    ms = {k: round(getattr(t, k) * 1e3) for k in ("cpu_s", "gpu_s", "head_s")}
    after = round(t.cpu_after_s * 1e3), round(t.gpu_after_s * 1e3)
    print(
        f"update of the last step: CPU {ms['cpu_s']} ms, GPU {ms['gpu_s']} ms; backward from "
        f"the first gradients to step() {ms['head_s']} ms; after step(): CPU, GPU {after} ms"
    )
    print(f"tier pages by node {off.pages_by_node()}")
    off.close()
    return 0


def checkpoint_first(model: Any, blocks: int) -> int:
    """Activation checkpointing of the model's first ``blocks`` blocks (the plan's);
    gives ``blocks``."""
    if blocks:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer in model.model.layers[blocks:]:
        layer.gradient_checkpointing = False
    model.train()
    return blocks


def offloaded_step(model: Any, args: argparse.Namespace, weights: str, hbm_blocks: int,
                   gpu: str | None) -> tuple[Any, Any]:  # fmt: skip
    """The model under ``offload_model`` and one step of the loop people write (AdamW,
    clip, a warm-up scheduler): ``(offload, step(tokens) -> loss)``."""
    import torch
    import transformers

    import pycxl

    adamw = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    made = next(model.parameters()).is_meta  # built on meta: made where it lives
    off = pycxl.offload_model(model, args.tier, gpu, optimizer=adamw, weights=weights,
                              hbm_blocks=hbm_blocks, initialise=made)  # fmt: skip
    sched = transformers.get_linear_schedule_with_warmup(off.optimizer, WARMUP, args.steps)

    def phase_ended(name: str) -> None:  # the first step's peak HBM in each phase
        if gpu is not None and len(PHASES) < 3:
            PHASES[name] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()

    def step(x: Any) -> Any:
        phase_ended("set-up")
        loss = model(input_ids=x, labels=x).loss
        phase_ended("forward")
        loss.backward()
        phase_ended("backward")
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        off.optimizer.step()
        off.optimizer.zero_grad()
        sched.step()
        return loss

    return off, step


def check_slice(args: argparse.Namespace, chosen: Any, gpu: str | None) -> int:
    """The losses of the model's first ``args.slice`` blocks placed as ``chosen`` places
    the whole (weights resident or streamed, state in HBM for at most all but one of
    them, checkpointing), against the same slice trained in HBM in fp32 (autocast to
    bf16, torch's fused AdamW): the same start (the bf16 weights), data and loop."""
    import torch
    import transformers

    on = "cuda" if gpu is not None else "cpu"
    whole = args.layers
    args.layers = args.slice
    held = min(chosen.hbm_blocks, args.slice - 1) if gpu is not None else 0
    checkpointed = min(chosen.checkpointed_blocks, args.slice)
    model = build(args, "cpu" if chosen.weights == "stream" or gpu is None else "cuda")
    checkpoint_first(model, checkpointed)
    off, step = offloaded_step(model, args, chosen.weights, held, gpu)
    losses, _ = train(step, args, on)
    off.close()
    del model, off, step
    reference = build(args, on).float()
    checkpoint_first(reference, checkpointed)
    adamw = torch.optim.AdamW(reference.parameters(), lr=LR, weight_decay=WEIGHT_DECAY,
                              fused=gpu is not None)  # fmt: skip
    sched = transformers.get_linear_schedule_with_warmup(adamw, WARMUP, args.steps)

    def fp32_step(x: Any) -> Any:
        with torch.autocast(on, dtype=torch.bfloat16):
            loss = reference(input_ids=x, labels=x).loss
        loss.backward()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), args.clip)
        adamw.step()
        adamw.zero_grad()
        sched.step()
        return loss

    expected, _ = train(fp32_step, args, on)
    apart = max(abs(a - b) for a, b in zip(losses, expected, strict=True))
    print(f"slice of {args.slice} of {whole} blocks, weights {chosen.weights}, "
          f"hbm_blocks {held}, checkpointed {checkpointed}:")  # fmt: skip
    print(f"pycxl losses      {[round(v, 4) for v in losses]}")
    print(f"HBM fp32 reference {[round(v, 4) for v in expected]}")
    print(f"largest difference {apart:.4f} ({apart / max(expected):.2%} of the largest loss)")
    return 0


def most_layers(args: argparse.Namespace, plan: Any) -> Any:
    """The plan for the most blocks of ``args``' shape that fit on ``plan``'s machine
    (its rates measured once); ``args.layers`` set to that count."""
    from pycxl.torch.offload import fit as planning

    def plan_for(layers: int) -> Any:
        args.layers = layers
        return planning.fit(model_shape(args), plan.machine, args.tokens)

    # low fits (1: none known to, the fewest a model has is 2); high does not
    low, high, found = 1, args.layers, plan
    while found.chosen is not None:
        low, plan, high = high, found, high * 2
        found = plan_for(high)
    while high - low > 1:
        middle = (low + high) // 2
        found = plan_for(middle)
        if found.chosen is not None:
            low, plan = middle, found
        else:
            high = middle
    if low == 1:
        args.layers = high
        return found  # not even two blocks fit: fit's answer says what is short
    args.layers = low
    print(f"the most blocks of this shape that fit here: {low} ({plan.shape.params / 1e9:.3g} B "
          f"parameters; {high} do not fit)", flush=True)  # fmt: skip
    return plan


def model_shape(args: argparse.Namespace) -> Any:
    import torch

    import pycxl

    with torch.device("meta"):  # the shape alone: nothing is allocated
        return pycxl.TrainShape.of_model(build(args, "meta"))


def train(step: Any, args: argparse.Namespace, on: str) -> tuple[list[float], list[float]]:
    """``args.steps`` steps of ``step(tokens) -> loss``; each step's loss and its time,
    loss to loss (reading the loss waits for that step's forward pass, not its update)."""
    import torch

    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, args.vocab, (1, args.tokens), generator=g) for _ in range(4)]
    losses, times = [], []
    t0 = time.perf_counter()
    for i in range(args.steps):
        losses.append(float(step(data[i % len(data)].to(on)).detach()))
        t1 = time.perf_counter()
        times.append(t1 - t0)
        print(f"step {i + 1}: loss {losses[-1]:.4f}, {times[-1] * 1e3:.0f} ms", flush=True)
        t0 = t1
    return losses, times


def report(name: str, shape: Any, args: argparse.Namespace, losses: list[float],
           times: list[float], checkpointed: int, on_gpu: bool) -> tuple[float, int]:  # fmt: skip
    """Prints the step (median after two), tokens/s, MFU, peak memory and losses; gives
    the step and the peak HBM allocated, in bytes."""
    import torch

    step = statistics.median(times[2:] or times)
    flops = 6 * shape.params * args.tokens + 6 * shape.layers * args.tokens**2 * shape.hidden
    flops *= (6 + 2 * checkpointed / shape.layers) / 6  # a checkpointed block runs twice
    # the steps' peak (PHASES: the first step's forward and backward passes apart)
    steps = [v for k, v in PHASES.items() if k != "set-up"]
    peak = max([torch.cuda.max_memory_allocated(), *steps]) if on_gpu else 0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{name}: {shape.params / 1e9:.3g} B parameters, step {step * 1e3:.0f} ms (mean "
          f"{statistics.mean(times) * 1e3:.0f}), {args.tokens / step:.0f} tokens/s, "
          f"MFU {flops / step / (args.peak_tflops * 1e12):.1%}", flush=True)  # fmt: skip
    print(f"peak HBM {peak / 2**30:.1f} GiB, host peak resident {rss:.1f} GiB")
    print(f"losses {[round(v, 4) for v in losses]}", flush=True)
    return step, peak


def deepspeed_in_children(args: argparse.Namespace) -> int:
    """Runs DeepSpeed at each ratio asked in a child process of its own (as a user
    tunes ``ratio`` until it runs), so that a run the kernel's OOM killer ends (host
    memory exhausted: no Python exception is raised) is reported too; then the fastest
    that ran."""
    ran: dict[float, float] = {}
    for ratio in args.deepspeed:
        env = dict(os.environ, **{CHILD: repr(ratio)})
        child = subprocess.Popen([sys.executable, *sys.argv], env=env, text=True,
                                 stdout=subprocess.PIPE)  # fmt: skip
        assert child.stdout is not None
        for line in child.stdout:
            print(line, end="", flush=True)
            step = STEP.search(line)
            if step:
                ran[ratio] = float(step.group(1))
        code = child.wait()
        if code < 0:
            print(f"DeepSpeed ZeRO-3, ratio {ratio:g}: failed: killed by "
                  f"{signal.Signals(-code).name} (SIGKILL: most likely the kernel's OOM "
                  "killer, host memory exhausted; see dmesg)", flush=True)  # fmt: skip
    if not ran:
        print("DeepSpeed ZeRO-3: no ratio asked runs here")
        return 1
    best = min(ran, key=lambda r: ran[r])
    print(f"DeepSpeed ZeRO-3's best here: ratio {best:g}, step {ran[best]:.0f} ms")
    return 0


def train_deepspeed(args: argparse.Namespace) -> int:
    from train_offload_vs_deepspeed import physical_cores

    if importlib.util.find_spec("deepspeed") is None:  # not imported: torch loads later
        print("DeepSpeed is not installed here: pip install deepspeed")
        return 1
    cores = physical_cores()  # as its launcher binds a rank, before torch loads
    os.sched_setaffinity(0, cores)
    os.environ["OMP_NUM_THREADS"] = str(len(cores))
    import torch
    import transformers

    shape = model_shape(args)
    name = f"DeepSpeed ZeRO-3, ratio {args.deepspeed:g}"
    try:
        engine = deepspeed_engine(
            args, lambda opt: transformers.get_linear_schedule_with_warmup(opt, WARMUP, args.steps)
        )

        def step(x: Any) -> Any:
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()  # clips and steps the scheduler
            return loss

        losses, times = train(step, args, "cuda")
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        print(f"{name}: failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        return 1
    torch.cuda.synchronize()
    report(name, shape, args, losses, times, args.layers, True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
