"""The largest model one GPU box trains: a Llama-shaped decoder (13 B by default: 40 layers,
hidden 5120, intermediate 13824, vocab 32000) placed as ``pycxl.fit`` places it (weights
resident or streamed, activation checkpointing where HBM is short, as many blocks' state
in HBM as it holds beside the step, the rest on the tier), then trained with the loop
people write (AdamW, clip 1.0, a warm-up scheduler) for ``--steps`` steps. Printed: fit's
placement and bound, the step (median after two), tokens/s, model FLOPs utilisation
against ``--peak-tflops``, the measured step against fit's bound, peak HBM, the host's
resident memory, and the losses.

The model is built where it lives: resident, on the GPU in bf16 (nothing of it on the
host); streamed, on the host in bf16 (offload_model moves the blocks' weights to the tier
and the rest to the GPU). Each run is one process; run DeepSpeed's ZeRO-3 offload beside it
with ``train_offload_vs_deepspeed.py``'s configurations at the same shape.

    python3 benchmarks/train_largest.py --tier dram0                 # 13 B on the GPU machine
    python3 benchmarks/train_largest.py --layers 2 --hidden 256 --intermediate 512 \\
        --vocab 1000 --tokens 64 --gpu none --hbm-free 4G           # a smoke run, no GPU
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from typing import Any

LR, WEIGHT_DECAY, WARMUP = 1e-4, 0.01, 3


def build(args: argparse.Namespace, device: str) -> Any:
    """The decoder in bf16, made on ``device`` directly (no fp32 copy anywhere)."""
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
        with torch.device(device):
            return transformers.LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(before)


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
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense bf16")
    args = ap.parse_args()

    import torch
    import transformers

    import pycxl

    gpu = None if args.gpu == "none" else args.gpu
    with torch.device("meta"):  # the shape alone: nothing is allocated to plan
        shape = pycxl.TrainShape.of_model(build(args, "meta"))
    plan = pycxl.fit(shape, args.tier, gpu, tokens=args.tokens, hbm_free=args.hbm_free)
    print(plan.why, flush=True)
    chosen = plan.chosen
    if chosen is None:
        return 8
    streamed = chosen.weights == "stream"
    device = "cpu" if gpu is None or streamed else "cuda"
    model = build(args, device)
    if chosen.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    adamw = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    held = chosen.hbm_blocks if gpu is not None else 0  # no GPU here: no HBM to hold state
    off = pycxl.offload_model(model, args.tier, gpu, optimizer=adamw, weights=chosen.weights,
                              hbm_blocks=held)  # fmt: skip
    print(off.plan(), flush=True)
    sched = transformers.get_linear_schedule_with_warmup(off.optimizer, WARMUP, args.steps)
    on = "cuda" if gpu is not None else "cpu"
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, args.vocab, (1, args.tokens), generator=g) for _ in range(4)]
    losses, times = [], []
    t0 = time.perf_counter()
    for i in range(args.steps):
        x = data[i % len(data)].to(on)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        off.optimizer.step()
        off.optimizer.zero_grad()
        sched.step()
        losses.append(float(loss.detach()))  # waits for this step's forward pass: loss to loss
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    off.synchronize()
    step = statistics.median(times[2:] or times)
    flops = 6 * shape.params * args.tokens + 6 * shape.layers * args.tokens**2 * shape.hidden
    flops *= 8 / 6 if chosen.checkpointing else 1
    peak = torch.cuda.max_memory_allocated() / 2**30 if gpu is not None else 0.0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{shape.params / 1e9:.2f} B parameters, weights {chosen.name}, "
          f"hbm_blocks {held}: step {step * 1e3:.0f} ms (mean "
          f"{statistics.mean(times) * 1e3:.0f}), {args.tokens / step:.0f} tokens/s, "
          f"MFU {flops / step / (args.peak_tflops * 1e12):.1%}", flush=True)  # fmt: skip
    if chosen.step_s:
        print(f"fit's bound {chosen.step_s * 1e3:.0f} ms: measured {step / chosen.step_s:.2f}x it")
    print(
        f"peak HBM {peak:.1f} GiB, host peak resident {rss:.1f} GiB; "
        f"tier pages by node {off.pages_by_node()}"
    )
    print(f"losses {[round(v, 4) for v in losses]}")
    off.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
