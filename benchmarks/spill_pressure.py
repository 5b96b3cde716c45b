"""A training script that outgrows HBM, run unchanged (on the GPU machine; dram0 stands
for the tier). A second process holds HBM, as a smaller card would, so that the script
has 1/RATIO of its peak free; each run is a process of its own, same model and data:

- hbm: nothing held: the reference losses, step time and peak;
- oom: held, plain PyTorch: must fail with CUDA out of memory;
- spill-fits: nothing held, ``pycxl spill TIER script.py``: what the spill costs a script
  that fits;
- spill-Nx: held so that 1/N of the peak is free, ``pycxl spill TIER script.py``.

Each spill run is set beside its bound: the HBM step plus what the summary says crossed
the link a step (state read and written, saved activations out and back) at the pinned
copy rate measured in this run (the slower direction, on the tier's node).

    python3 benchmarks/spill_pressure.py [--tier dram0] [--ratios 2,3] [-- SCRIPT ARGS]

The default script is spill_scripts/gpt2_train.py; what follows ``--`` replaces it
(spill_scripts/llama_generate.py: inference, a step a token, its tokens against HBM's;
its bound the larger of HBM's token, which is Python launching kernels at batch 1, and
what spilled at the pinned rate, read in place once a token).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HOLDER = r"""
import sys, torch
keep = int(sys.argv[1])
free, _ = torch.cuda.mem_get_info()
held = torch.empty(max(free - keep, 0), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("held", held.numel(), "free", torch.cuda.mem_get_info()[0], flush=True)
sys.stdin.read()
"""


RATE = r"""
import json, torch
n = 1 << 30
dev = torch.empty(n, dtype=torch.uint8, device="cuda")
host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
rates = []
for dst, src in ((host, dev), (dev, host)):
    best = 0.0
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); dst.copy_(src, non_blocking=True); b.record(); b.synchronize()
        best = max(best, n / (a.elapsed_time(b) / 1e3))
    rates.append(best)
print(json.dumps({"d2h": rates[0], "h2d": rates[1]}))
"""
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
OVER_LINK = re.compile(r"optimizer state ([\d.]+) (\w+) read and written, saved activations "
                       r"([\d.]+) (\w+) out and back")  # fmt: skip


SPILLED = re.compile(r"other \(spilled\) ([\d.]+) (\w+)")


def link_bytes(stderr_tail: list[str], inference: bool) -> int | None:
    """Bytes a step moves over the link, from ``pycxl spill``'s summary: training, the
    state and saved activations it names; inference (a step is a token), what spilled,
    which the kernels read in place once a token (the weights and KV cache there)."""
    for line in stderr_tail:
        m = (SPILLED if inference else OVER_LINK).search(line)
        if m and inference:
            return int(float(m[1]) * UNITS[m[2]])
        if m:
            return int(float(m[1]) * UNITS[m[2]] + float(m[3]) * UNITS[m[4]])
    return None


def run(cmd: list[str], timeout: float) -> dict:
    began = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"still running after {timeout:.0f} s", "wall_s": timeout}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    row = json.loads(lines[-1]) if lines else {"error": _last_error(p.stderr)}
    row["wall_s"] = round(time.monotonic() - began, 1)
    if "error" in row or p.returncode:
        row["stderr_tail"] = p.stderr.splitlines()[-30:]
    row["link_bytes"] = link_bytes(p.stderr.splitlines()[-6:], inference="tokens" in row)
    said = streamer_said(p.stderr)
    if said:
        row["streamer"] = said
    return row


def streamer_said(stderr: str) -> str | None:
    """The weight streamer's decision, as the spill logged it: streaming (with the bytes
    it moved for its ring, which then live on the tier too) or reading in place, why."""
    lines = [ln for ln in stderr.splitlines() if "spilled weights" in ln]
    return lines[-1].split("spilled weights", 1)[1].strip() if lines else None


def _last_error(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors or lines or ["(no output)"])[-1][:300]


def held(keep: int):
    h = subprocess.Popen([sys.executable, "-c", HOLDER, str(keep)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    print("  holder:", h.stdout.readline().strip(), flush=True)
    return h


def median(xs: list[float]) -> float:
    s = sorted(xs[2:] or xs)  # after the first two steps (warm-up), where there are more
    return s[len(s) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tier", default="dram0")
    ap.add_argument("--ratios", default="2,3")
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("script", nargs="*")
    a = ap.parse_args()
    script = a.script or [os.path.join(HERE, "spill_scripts", "gpt2_train.py")]
    plain = [sys.executable, *script]
    # pinned host memory on the tier's node, as the spill's is
    rate = json.loads(subprocess.run(["pycxl", "run", "--membind", a.tier, "--", sys.executable,
                                      "-c", RATE], capture_output=True, text=True,
                                     check=True).stdout)  # fmt: skip
    link = min(rate["d2h"], rate["h2d"])
    print(f"pinned copies: {rate['d2h'] / 1e9:.1f} GB/s out, {rate['h2d'] / 1e9:.1f} GB/s in",
          flush=True)  # fmt: skip
    rows = {"hbm": run(plain, a.timeout)}
    ref = rows["hbm"]
    print("hbm", json.dumps(ref), flush=True)
    if "max_reserved" not in ref:
        return
    rows["spill-fits"] = run(["pycxl", "spill", a.tier, *script], a.timeout)
    print("spill-fits", json.dumps(rows["spill-fits"]), flush=True)
    context = ref["total"] - ref["free"] - ref["reserved"]  # the CUDA context and libraries
    for ratio in [float(r) for r in a.ratios.split(",")]:
        keep = int(ref["max_reserved"] / ratio) + context
        h = held(keep)
        try:
            if ratio == float(a.ratios.split(",")[0]):
                rows["oom"] = run(plain, a.timeout)
                print("oom", json.dumps(rows["oom"]), flush=True)
            name = f"spill-{ratio:g}x"
            rows[name] = run(["pycxl", "spill", a.tier, *script], a.timeout)
            print(name, json.dumps(rows[name]), flush=True)
        finally:
            h.stdin.close()
            h.wait()
    base = median(ref["step_ms"])
    print(f"\nhbm: {base:.1f} ms a step, peak reserved {ref['max_reserved'] / 2**30:.1f} GiB")
    for name, row in rows.items():
        if name == "hbm":
            continue
        if "losses" not in row and "tokens" not in row:
            print(f"{name}: {row.get('error')}")
            continue
        step = median(row["step_ms"])
        if "tokens" in row:
            same = row["tokens"] == ref["tokens"]
            outcome = "tokens equal to HBM's" if same else "TOKENS DIFFER from HBM's"
        else:
            gap = max(abs(x - y) for x, y in zip(row["losses"], ref["losses"], strict=False))
            outcome = f"losses within {gap:.2e}"
        bound = ""
        if row.get("link_bytes"):
            over = row["link_bytes"] / link * 1e3
            # training: the step's compute, then what crossed the link; a token: Python
            # launching its kernels (HBM's token) runs beside the GPU's read of what
            # spilled, so the larger of the two
            ms = max(base, over) if "tokens" in row else base + over
            bound = (f", bound {ms:.1f} ms ({row['link_bytes'] / 2**30:.2f} GiB over the link): "
                     f"{step / ms:.2f}x the bound")  # fmt: skip
        peak = row["max_allocated"] / 2**30
        print(f"{name}: {step:.1f} ms a step ({step / base:.2f}x hbm), {outcome}, "
              f"max_allocated {peak:.1f} GiB{bound}")  # fmt: skip
        if row.get("streamer"):
            print(f"  spilled weights {row['streamer']}")


if __name__ == "__main__":
    main()
