"""An ordinary Hugging Face training loop that runs out of HBM, with and without the spill
(on the GPU machine; dram0 stands for the tier). HBM is filled with a plain allocation to
stand in for a smaller card, leaving HEADROOM; each configuration runs in a process of
its own, same model, data and seed:

- hbm: enough HBM (no blocker): the reference losses and step time;
- oom: the blocker, no spill: must fail with CUDA out of memory;
- spill: the blocker and ``pycxl.spill_to(TIER)`` as the one added line;
- state-on-tier: enough HBM, the optimizer's state created on the tier
  (``with pycxl.on_tier(TIER): opt.step()`` on the first step), updated by the GPU;
- offload-model: the blocker, and the same model trained by ``pycxl.offload_model`` with
  its blocks' weights, gradients and state on the tier (built on the CPU, streamed;
  ``update="cpu"``: the GPU side's buffers would not fit beside the blocker): what a loop
  written for the tier does where the spill keeps an unchanged one running.

    python3 benchmarks/spill_training.py [TIER] [HEADROOM_GIB]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

STEPS = 12
CHILD = r"""
import json, sys, time, torch
mode, tier, headroom = sys.argv[1], sys.argv[2], float(sys.argv[3])
import pycxl
if mode == "spill":
    pool = pycxl.spill_to(tier)
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
blocker = None
if mode in ("oom", "spill", "offload-model"):
    free, _ = torch.cuda.mem_get_info()
    blocker = torch.empty(int(free - headroom * (1 << 30)), dtype=torch.uint8, device="cuda")
cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                  num_attention_heads=16, num_key_value_heads=16, vocab_size=32000)
if mode == "offload-model":
    model = LlamaForCausalLM(cfg)  # on the CPU: the blocks go to the tier, the rest to HBM
    off = pycxl.offload_model(model, tier, "gpu0", weights="stream", update="cpu",
                              optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4))
    opt = off.optimizer
else:
    model = LlamaForCausalLM(cfg).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # one pass over the state
g = torch.Generator().manual_seed(1)
batches = [torch.randint(0, 32000, (4, 512), generator=g) for _ in range(STEPS)]
losses, times = [], []
try:
    for i, ids in enumerate(batches):
        ids = ids.to("cuda")
        torch.cuda.synchronize(); t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if mode == "state-on-tier" and i == 0:
            with pycxl.on_tier(tier):
                opt.step()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
        losses.append(float(loss))
except torch.OutOfMemoryError as e:
    print(json.dumps({"mode": mode, "oom": str(e).splitlines()[0][:160], "steps": len(losses)}))
    sys.exit(0)
out = {"mode": mode, "losses": losses, "step_ms": sorted(times[2:])[len(times[2:]) // 2] * 1e3}
if mode != "spill":  # a pluggable allocator keeps no device statistics in PyTorch
    out["peak_hbm_gib"] = torch.cuda.max_memory_allocated() / 2**30
if mode == "spill":
    s = pool.stats()
    out.update(spilled_now=s.bytes_now, spilled_peak=s.bytes_peak, spills=s.allocations,
               misplaced=s.misplaced_pages)
if mode == "state-on-tier":
    p = next(iter(model.parameters()))
    st = opt.state[p]["exp_avg"]
    from pycxl.numa import pages
    out["state_pages"] = pages.span_by_node(st.data_ptr(), st.numel() * 4)
    out["state_bytes"] = sum(v.numel() * v.element_size() for s in opt.state.values()
                             for v in s.values() if torch.is_tensor(v) and v.is_cuda)
print(json.dumps(out))
""".replace("STEPS", str(STEPS))


def main() -> None:
    tier = sys.argv[1] if len(sys.argv) > 1 else "dram0"
    headroom = sys.argv[2] if len(sys.argv) > 2 else "1.5"
    rows = {}
    for mode in ("hbm", "oom", "spill", "state-on-tier", "offload-model"):
        began = time.monotonic()
        p = subprocess.run([sys.executable, "-c", CHILD, mode, tier, headroom],
                           capture_output=True, text=True, check=False)  # fmt: skip
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        rows[mode] = json.loads(lines[-1]) if lines else {"error": p.stderr[-1500:]}
        rows[mode]["wall_s"] = round(time.monotonic() - began, 1)
        print(json.dumps(rows[mode]))
    ref = rows["hbm"].get("losses", [])
    for mode in ("spill", "state-on-tier", "offload-model"):
        got = rows[mode].get("losses")
        if got and ref:
            worst = max(abs(a - b) for a, b in zip(ref, got, strict=True))
            print(f"{mode}: losses within {worst:.2e} of hbm; step "
                  f"{rows[mode]['step_ms']:.1f} ms vs {rows['hbm']['step_ms']:.1f} ms "
                  f"({rows[mode]['step_ms'] / rows['hbm']['step_ms']:.2f}x)")  # fmt: skip
    if "step_ms" in rows["state-on-tier"]:
        moved = 2 * rows["state-on-tier"]["state_bytes"]  # each moment read and written
        bound = moved / 55e9 * 1e3 + rows["hbm"]["step_ms"]
        print(f"state-on-tier bound {bound:.1f} ms (state {moved / 1e9:.2f} GB over 55 GB/s "
              f"+ hbm step): {rows['state-on-tier']['step_ms'] / bound:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
