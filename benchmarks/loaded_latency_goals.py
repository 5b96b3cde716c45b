"""Loaded latency against its goals, side by side in one run (docs/benchmarks.md):

- the idle point (its median window) equals ``pycxl bench latency`` (median) on the
  same memory within 3%;
- the unpaced (highest) point of each mix reaches >= 0.95 x ``pycxl bench bandwidth
  --mix`` for that mix and tier;
- a repeat of the same curves agrees point by point within 5% (median latency and
  bandwidth reached);
- with a GPU: the CPU's latency while the GPU's copy engines stream the tier, and the
  GPU's zero-copy latency while CPUs load it.

    python3 benchmarks/loaded_latency_goals.py [TARGET] [--out FILE.json] [--gpu gpu0]

Everything runs with the commands' defaults. Prints a summary; the JSON has every point.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from pycxl.bench import dispatch
from pycxl.measure.results import bench_result_json


def pairs(a: Any, b: Any) -> list[tuple[Any, Any]]:
    """Paced points of two curves, matched by their fraction of each curve's peak."""
    pa = sorted((p for p in a.points if p.target_bytes_per_s), key=lambda p: p.target_bytes_per_s)
    pb = sorted((p for p in b.points if p.target_bytes_per_s), key=lambda p: p.target_bytes_per_s)
    ua = [p for p in a.points if p.unpaced]
    ub = [p for p in b.points if p.unpaced]
    return [(a.points[0], b.points[0]), *zip(pa, pb, strict=False), *zip(ua, ub, strict=False)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("target", nargs="?", default="dram0")
    ap.add_argument("--out", default="loaded.json")
    ap.add_argument("--gpu", default=None)
    args = ap.parse_args()
    t = args.target
    doc: dict[str, Any] = {"target": t}
    began = time.perf_counter()

    def save() -> None:
        doc["elapsed_s"] = time.perf_counter() - began
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)

    # idle: the idle point and bench latency side by side, alternating, three rounds
    from pycxl.measure import latency, loaded
    from pycxl.measure.conditions import pinned
    from pycxl.resolve.system import snapshot

    s = snapshot(gpus=False)
    p = s.pair(t)
    rounds = []
    chaser = loaded.CpuChaser(p.node, latency.default_size())
    try:
        for _ in range(3):
            lat = latency.chase_latency(p)
            with pinned(p.cpus[0]):
                idle = loaded.measure_point(chaser, None, None, seconds=1.0, warmup=0)
            rounds.append((lat.latency_ns_median, idle.latency_ns_p50, idle.latency_ns))
    finally:
        chaser.close()
    doc["idle_rounds"] = rounds
    bench_ns = statistics.median(r[0] for r in rounds)
    idle_ns = statistics.median(r[1] for r in rounds)
    print(f"idle, 3 rounds side by side: bench latency median {bench_ns:.1f} ns, idle point "
          f"p50 {idle_ns:.1f} ns, ratio {idle_ns / bench_ns:.3f}; rounds {rounds}")  # fmt: skip

    # peaks by mix: every CPU, and the loaded curves' own load CPUs (all but the chase's)
    peaks = {r.kernel: r for r in dispatch.measure_bandwidth(t, mix="all")}  # type: ignore[attr-defined]
    load_cpus = len(p.cpus) - 1
    same = {r.kernel: r for r in  # type: ignore[attr-defined]
            dispatch.measure_bandwidth(t, mix="all", threads=load_cpus)}  # fmt: skip
    doc["bench_bandwidth_mix"] = [bench_result_json(r) for r in peaks.values()]
    doc["bench_bandwidth_mix_load_cpus"] = [bench_result_json(r) for r in same.values()]
    save()
    # each curve twice, back to back (the repeat)
    first, again = [], []
    for mix in loaded.MIXES:
        first += dispatch.measure_loaded_latency(t, mix=mix, system=s)
        again += dispatch.measure_loaded_latency(t, mix=mix, system=s)
        doc["curves"] = [bench_result_json(r) for r in first]
        doc["repeat"] = [bench_result_json(r) for r in again]
        save()

    print(f"{'mix':9} {'idle ns':>8} {'top GB/s':>9} {'peak all':>9} {'top/all':>8} "
          f"{'peak load':>9} {'top/load':>8} {'knee GB/s':>10} {'rep max':>8} "
          f"{'rep med':>8}")  # fmt: skip
    goals = {"idle_within_3pct": abs(idle_ns / bench_ns - 1) <= 0.03, "top_ge_095": True,
             "repeat_within_5pct": True}  # fmt: skip
    for r, r2 in zip(first, again, strict=True):
        top = max(q.achieved_bytes_per_s for q in r.points)
        top_all = top / peaks[r.mix].bytes_per_s
        top_same = top / same[r.mix].bytes_per_s
        devs = []
        for x, y in pairs(r, r2):
            devs.append(abs(x.latency_ns_p50 - y.latency_ns_p50) / x.latency_ns_p50)
            if x.achieved_bytes_per_s:
                devs.append(abs(x.achieved_bytes_per_s - y.achieved_bytes_per_s)
                            / x.achieved_bytes_per_s)  # fmt: skip
        goals["top_ge_095"] &= top_same >= 0.95
        goals["repeat_within_5pct"] &= max(devs) <= 0.05
        knee = "-" if r.knee_bytes_per_s is None else f"{r.knee_bytes_per_s / 1e9:.1f}"
        print(f"{r.mix:9} {r.idle_latency_ns:8.1f} {top / 1e9:9.2f} "
              f"{peaks[r.mix].bytes_per_s / 1e9:9.2f} {top_all:8.3f} "
              f"{same[r.mix].bytes_per_s / 1e9:9.2f} {top_same:8.3f} {knee:>10} "
              f"{max(devs):8.3f} {statistics.median(devs):8.3f}")  # fmt: skip
        for q, q2 in pairs(r, r2):
            asked = "idle" if q.target_bytes_per_s is None and not q.unpaced else (
                "unpaced" if q.unpaced else f"{q.target_bytes_per_s / 1e9:.1f}")  # fmt: skip
            print(f"    {asked:>8} -> {q.achieved_bytes_per_s / 1e9:7.2f} GB/s  p50 "
                  f"{q.latency_ns_p50:7.1f} (repeat {q2.latency_ns_p50:7.1f})  mean "
                  f"{q.latency_ns:7.1f}  p99 {q.latency_ns_p99:8.1f}"
                  f"{'' if q.reached else '  (fell short)'}")  # fmt: skip
    doc["goals"] = goals
    save()

    if args.gpu:
        g = args.gpu
        gl = dispatch.measure_loaded_latency(t, load_from=g, mix="read,nt-write,1:1", steps=4)
        doc["gpu_load"] = [bench_result_json(r) for r in gl]
        save()
        for r in gl:
            top = max(r.points, key=lambda p: p.achieved_bytes_per_s)
            print(f"CPU chase on {t} while {g} copies ({r.mix}): idle {r.idle_latency_ns:.1f} "
                  f"ns; at {top.achieved_bytes_per_s / 1e9:.2f} GB/s: mean {top.latency_ns:.1f}"
                  f", p50 {top.latency_ns_p50:.1f}, p99 {top.latency_ns_p99:.1f} ns")  # fmt: skip
        (gc,) = dispatch.measure_loaded_latency(t, g, mix="read", steps=4)
        doc["gpu_chase"] = bench_result_json(gc)
        save()
        top = max(gc.points, key=lambda p: p.achieved_bytes_per_s)
        print(f"{g} zero-copy chase on {t} while CPUs read it: idle "
              f"{gc.idle_latency_ns:.1f} ns; at {top.achieved_bytes_per_s / 1e9:.2f} GB/s: "
              f"{top.latency_ns:.1f} ns")  # fmt: skip
    print("goals:", json.dumps(goals), f"({time.perf_counter() - began:.0f} s)")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
