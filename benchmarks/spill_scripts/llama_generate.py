"""An ordinary Hugging Face inference script, written with no thought of tiers: a
Llama-shaped model made in bf16 on the GPU (as ``from_pretrained(..., dtype=torch.bfloat16,
device_map="cuda")`` places one), greedy ``generate`` from a fixed prompt, and a closing
report of its own memory. benchmarks/spill_pressure.py runs it unchanged, with and
without ``pycxl spill``.

    python3 llama_generate.py [--layers 8] [--hidden 8192] [--prompt 128] [--new 48]

The default shape (6.3 B parameters, 12.6 GB of bf16 weights in 8 wide layers) puts
gigabytes on the tier at 2x and 3x, whose read over the link (over 100 ms a token) is
more than Python's launch of the token's kernels; a narrow, deep model of the same size
spends longer launching, and what the link costs hides under that.

Prints one JSON line: the tokens made, each token's time (ms, the first is the prompt's
pass) and torch's own memory figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, StoppingCriteria

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--hidden", type=int, default=8192)
ap.add_argument("--prompt", type=int, default=128)
ap.add_argument("--new", type=int, default=48)
args = ap.parse_args()

torch.manual_seed(0)
h = args.hidden
cfg = LlamaConfig(vocab_size=32000, hidden_size=h, intermediate_size=h * 11 // 4,
                  num_hidden_layers=args.layers, num_attention_heads=h // 128,
                  num_key_value_heads=h // 512, max_position_embeddings=4096)  # fmt: skip
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).eval()
gen = torch.Generator().manual_seed(1)
prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt), generator=gen)


class Clock(StoppingCriteria):
    """Each token's end (generate asks after every token): the times between them."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw: object) -> torch.Tensor:
        torch.cuda.synchronize()
        self.marks.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


clock = Clock()
ids = prompt.cuda()
torch.cuda.synchronize()
began = time.perf_counter()
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False,
                         stopping_criteria=[clock], pad_token_id=0)  # fmt: skip
marks = [began, *clock.marks]
free, total = torch.cuda.mem_get_info()
print(json.dumps({"tokens": out[0, args.prompt :].tolist(),
                  "step_ms": [(b - a) * 1e3 for a, b in itertools.pairwise(marks)],
                  "max_allocated": torch.cuda.max_memory_allocated(),
                  "max_reserved": torch.cuda.max_memory_reserved(),
                  "allocated": torch.cuda.memory_allocated(),
                  "reserved": torch.cuda.memory_reserved(), "free": free, "total": total,
                  "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                  "params": sum(p.numel() for p in model.parameters())}))  # fmt: skip
