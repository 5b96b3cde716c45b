"""A Hugging Face Llama whose decoder layers stream from a host tier, on the GPU machine,
against its bound in one run: forward passes link-bound (2,048 tokens) and compute-bound
(32,768 tokens), and ``generate`` with the tokens of the model all in HBM.

    python3 benchmarks/llama_inference_offload.py --tier dram0 [--rounds 3]

Model: a randomly initialised ``LlamaForCausalLM`` in bf16, 16 decoder layers of hidden
4096, intermediate 11008, 32 heads of which 8 key/value (338 MiB a layer, 5.8 GiB in all),
vocab 32000. The bound of a forward pass is the larger of the same pass all in HBM and
the layers' bytes over the pinned bandwidth from the tier to the GPU (what ``pycxl bench
transfer --direction h2d`` gives for four layers' bytes, measured in the same run). Per
round: each pass's median over 5 steps after 2 untimed ones; the table gives the median
over rounds and the range. Beside it, the peer users would reach for: Hugging Face
accelerate's ``cpu_offload`` on each decoder layer of the same model, its weights in
pageable memory on the same tier (pages counted), one round.
"""

from __future__ import annotations

import argparse
import gc
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


def median_s(fn: Any, steps: int = STEPS, warmup: int = WARMUP) -> float:
    times = []
    for k in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pinned_h2d(tier: str, nbytes: int) -> float:
    """Bytes per second from pinned memory on the tier to the GPU (``pycxl bench
    transfer``'s figure)."""
    (res,) = pycxl.bench.measure_transfer("gpu0", tier, direction="h2d", size=nbytes)
    return res.bytes_per_s


def accelerate_llama(node: int) -> tuple[Any, float]:
    """A second copy of the model (same seed, same weights) with accelerate's
    ``cpu_offload`` on each decoder layer, its weights copied out while this thread's
    memory is bound to the tier's ``node``; with the share of their pages there."""
    from accelerate import cpu_offload

    from pycxl.numa.pages import pages_by_node
    from pycxl.numa.policy import thread_policy

    model = llama()
    on_node = total = 0
    for layer in model.model.layers:
        with thread_policy(pycxl.Policy.bind(node)):  # cpu_offload's own copy, made here
            weights = {n: t.to("cpu") for n, t in layer.state_dict().items()}
        cpu_offload(layer, execution_device=torch.device("cuda", 0), state_dict=weights)
        for t in weights.values():
            counts = pages_by_node(t)
            on_node += counts.get(node, 0)
            total += sum(counts.values())
    return model, on_node / max(total, 1)


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
    assert node is not None  # pinned_h2d has placed memory there
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
    del model, off, layers
    gc.collect()  # cycles that would keep the first model's memory
    torch.cuda.empty_cache()

    model, share = accelerate_llama(node)
    print(f"accelerate cpu_offload, each layer's weights on {a.tier}: "
          f"{100 * share:.1f}% of their pages there; one round")  # fmt: skip
    for name, x in passes.items():
        t = median_s(lambda x=x: forward(x))
        bound = max(statistics.median(hbm[name]), link_s)
        print(f"forward, {name}: accelerate {t * 1e3:.1f} ms = {t / bound:.2f}x the bound")
    tokens = generate()
    t = median_s(generate, steps=1, warmup=0)
    print(f"generate {new} tokens: the HBM model's tokens {bool(torch.equal(tokens, want))}; "
          f"accelerate {t / new * 1e3:.1f} ms a token ({t / new / link_s:.2f}x the link "
          f"bound)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
