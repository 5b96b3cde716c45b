"""A Hugging Face Llama whose decoder layers stream from a host tier, on the GPU machine,
against its bound in one run: forward passes link-bound (2,048 tokens) and compute-bound
(32,768 tokens), and ``generate`` with the tokens of the model all in HBM.

    python3 benchmarks/llama_inference_offload.py --tier dram0 [--rounds 3]

Model: a randomly initialised ``LlamaForCausalLM`` in bf16, 16 decoder layers of hidden
4096, intermediate 11008, 32 heads of which 8 key/value (338 MiB a layer, 5.8 GiB in all),
vocab 32000. The bound of a forward pass is the larger of the same pass all in HBM and
the layers' bytes over the pinned bandwidth from the tier to the GPU (best of ten
copies of four layers' bytes, measured in the same run). Per round: each pass's median
over 5 steps after 2 untimed ones; the table gives the median over rounds and the range.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch

import pycxl

STEPS, WARMUP = 5, 2


def llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=4096,
    )
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):  # made on the GPU: a CPU init of 23 GB of fp32 is slow
        model = LlamaForCausalLM(cfg)
    return model.to(torch.bfloat16).eval()


def median_s(fn: Any) -> float:
    times = []
    for k in range(WARMUP + STEPS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if k >= WARMUP:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pinned_h2d(tier: str, nbytes: int) -> float:
    """Bytes per second from pinned memory on the tier to the GPU, best of ten."""
    host = pycxl.pinned_tensor(nbytes, torch.uint8, tier, "gpu0")
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = float("inf")
    for _ in range(10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    del host, dev
    return nbytes / best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tier", default="dram0")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    model = llama()
    layers = model.model.layers
    layer_bytes = sum(p.numel() * p.element_size() for p in layers[0].parameters())
    g = torch.Generator().manual_seed(1)
    passes = {
        "2048 tokens": torch.randint(0, 32000, (1, 2048), generator=g).cuda(),
        "32768 tokens": torch.randint(0, 32000, (8, 4096), generator=g).cuda(),
    }
    prompt = torch.randint(0, 32000, (1, 32), generator=g).cuda()

    def forward(x: Any) -> Any:
        with torch.no_grad():
            return model(input_ids=x, logits_to_keep=1)

    def generate() -> Any:
        with torch.no_grad():
            return model.generate(prompt, max_new_tokens=16, do_sample=False, min_new_tokens=16)

    hbm = {name: [median_s(lambda x=x: forward(x)) for _ in range(a.rounds)]
           for name, x in passes.items()}  # fmt: skip
    want = generate()
    gen_hbm = [median_s(generate) for _ in range(a.rounds)]
    h2d = pinned_h2d(a.tier, 4 * layer_bytes)
    link_s = len(layers) * layer_bytes / h2d
    off = pycxl.offload_layers(layers, a.tier, "gpu0")
    node = pycxl.snapshot(gpus=False).resolve(a.tier).node
    pages = off.pages_by_node()
    print(f"{len(layers)} layers of {layer_bytes / 2**20:.0f} MiB on {a.tier} (node {node}): "
          f"pages {pages}; pinned h2d {h2d / 1e9:.1f} GB/s, link bound "
          f"{link_s * 1e3:.1f} ms a pass")  # fmt: skip
    for name, x in passes.items():
        got = [median_s(lambda x=x: forward(x)) for _ in range(a.rounds)]
        bound = max(statistics.median(hbm[name]), link_s)
        ratios = [t / bound for t in got]
        which = "link" if link_s >= statistics.median(hbm[name]) else "compute"
        print(f"forward, {name}: streamed {statistics.median(got) * 1e3:.1f} ms, HBM "
              f"{statistics.median(hbm[name]) * 1e3:.1f} ms, bound {bound * 1e3:.1f} ms "
              f"({which}): {statistics.median(ratios):.3f}x "
              f"({min(ratios):.3f}-{max(ratios):.3f})")  # fmt: skip
    tokens = generate()
    gen = [median_s(generate) for _ in range(a.rounds)]
    new = tokens.shape[1] - prompt.shape[1]
    print(f"generate {new} tokens: the HBM model's tokens {bool(torch.equal(tokens, want))}; "
          f"streamed {statistics.median(gen) / new * 1e3:.1f} ms a token, link bound "
          f"{link_s * 1e3:.1f} ms ({statistics.median(gen) / new / link_s:.3f}x), HBM "
          f"{statistics.median(gen_hbm) / new * 1e3:.1f} ms a token")  # fmt: skip
    off.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
