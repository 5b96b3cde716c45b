"""An ordinary Hugging Face training script, written with no thought of tiers: a GPT-2
shaped model in fp32, bf16 autocast, fused AdamW with weight decay, a warm-up schedule,
clipping by global norm, and a closing report of its own memory, as users print it.
benchmarks/spill_pressure.py runs it unchanged, with and without ``pycxl spill``.

    python3 gpt2_train.py [--layers 24] [--hidden 1024] [--batch 8] [--seq 1024] [--steps 8]

Prints one JSON line: losses, step times (ms) and torch's own memory figures.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=24)
ap.add_argument("--hidden", type=int, default=1024)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--seq", type=int, default=1024)
ap.add_argument("--steps", type=int, default=8)
args = ap.parse_args()

torch.manual_seed(0)
cfg = GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.hidden // 64,
                 n_positions=args.seq, vocab_size=50257)  # fmt: skip
model = GPT2LMHeadModel(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
sched = get_linear_schedule_with_warmup(opt, 2, 1000)
gen = torch.Generator().manual_seed(1)
losses, times = [], []
for _ in range(args.steps):
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=gen).cuda()
    torch.cuda.synchronize()
    began = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append((time.perf_counter() - began) * 1e3)
    losses.append(loss.item())
free, total = torch.cuda.mem_get_info()
print(json.dumps({"losses": losses, "step_ms": times,
                  "max_allocated": torch.cuda.max_memory_allocated(),
                  "max_reserved": torch.cuda.max_memory_reserved(),
                  "allocated": torch.cuda.memory_allocated(),
                  "reserved": torch.cuda.memory_reserved(), "free": free, "total": total,
                  "params": sum(p.numel() for p in model.parameters())}))  # fmt: skip
