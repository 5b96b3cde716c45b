"""Loaded latency and peak bandwidth by mix, on this host's DRAM (real threads, real
memory; small sizes): the shape of a curve, what each point says, and the refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pycxl.base.errors import InvalidRequestError, NotAvailableError, NotFoundError
from pycxl.bench import dispatch
from pycxl.measure import loaded
from pycxl.measure.results import LoadedPoint, bench_result_json

QUICK = dict(size="1M", load_size="8M", seconds=0.1, steps=3)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYCXL_BENCH_QUICK": "1"}
    return subprocess.run([sys.executable, "-m", "pycxl.cli.main", *args], capture_output=True,
                          text=True, env=env, check=False)  # fmt: skip


def _point(bw: float, ns: float) -> LoadedPoint:
    return LoadedPoint(target_bytes_per_s=bw, unpaced=False, achieved_bytes_per_s=bw,
                       achieved_ratio=1.0, reached=True, latency_ns=ns, latency_ns_p50=ns,
                       latency_ns_p99=ns, windows=1, duration_s=1.0)  # fmt: skip


def test_knee_is_interpolated_between_the_points_around_it() -> None:
    points = [_point(0, 100), _point(10e9, 120), _point(20e9, 180), _point(30e9, 400)]
    # 1.5 x 100 ns = 150 ns: between 120 ns at 10 GB/s and 180 ns at 20 GB/s
    assert loaded.knee(points, 100, 1.5) == pytest.approx(15e9)
    assert loaded.knee(points, 100, 5.0) is None


def test_mixes_are_named_and_refused() -> None:
    assert loaded.mix_names("all") == list(loaded.MIXES)
    assert loaded.mix_names("nt-write,read") == ["read", "nt-write"]
    for bad in ("4:1", "", "read,writes"):
        with pytest.raises(InvalidRequestError, match="read, 3:1"):
            loaded.mix_names(bad)


def test_a_curve_on_dram() -> None:
    (r,) = dispatch.measure_loaded_latency("dram0", mix="read", **QUICK)  # type: ignore[arg-type]
    idle, *loaded_points = r.points
    assert idle.target_bytes_per_s is None and not idle.unpaced
    assert idle.achieved_bytes_per_s == 0 and idle.windows > 0
    assert loaded_points[-1].unpaced or any(p.unpaced for p in loaded_points)
    paced = [p for p in loaded_points if p.target_bytes_per_s is not None]
    assert len(paced) == 2 and all(p.achieved_ratio is not None for p in paced)
    for p in paced:  # a point that fell short says so, not its target
        assert p.reached == (p.achieved_ratio >= loaded.REACHED)  # type: ignore[operator]
    assert r.peak_bytes_per_s > 0 and r.idle_latency_ns == idle.latency_ns_p50
    assert all(p.latency_ns_p50 <= p.latency_ns_p99 for p in r.points)
    assert r.pages_on_node == r.pages and r.load_pages_on_node == r.load_pages
    assert r.cpus and r.cpus[0] not in r.load_cpus
    doc = bench_result_json(r)
    assert doc["benchmark"] == "loaded-latency" and len(doc["points"]) == len(r.points)


def test_peak_bandwidth_by_mix() -> None:
    rs = dispatch.measure_bandwidth("dram0", mix="read,2:1", size="8M", samples=2)
    assert [r.kernel for r in rs] == ["read", "2:1"]  # type: ignore[attr-defined]
    assert all(r.bytes_per_s > 0 and r.pages_on_node == r.pages for r in rs)  # type: ignore[attr-defined]


def test_bad_requests_are_refused_before_anything_runs() -> None:
    with pytest.raises(InvalidRequestError, match="load threads"):
        dispatch.measure_loaded_latency("dram0", load_threads=64, **QUICK)  # type: ignore[arg-type]
    paced = {**QUICK, "steps": None}  # rates say the points themselves
    with pytest.raises(InvalidRequestError, match="above 0"):
        dispatch.measure_loaded_latency("dram0", rates=[0.0], **paced)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="above what"):
        dispatch.measure_loaded_latency("dram0", rates=[1e15], **paced)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="not rates and steps"):
        dispatch.measure_loaded_latency("dram0", rates=[1e9], **QUICK)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="--kernel"):
        dispatch.measure_bandwidth("dram0", mix="read", kernel="triad")
    with pytest.raises((NotAvailableError, NotFoundError, InvalidRequestError)):
        dispatch.measure_loaded_latency("dram0", load_from="gpu0", **QUICK)  # type: ignore[arg-type]


def test_cli_loaded_latency_defaults_and_errors() -> None:
    p = cli("bench", "loaded-latency", "--target", "dram0")
    assert p.returncode == 0, p.stderr
    assert "loaded latency: dram0 from dram0" in p.stdout and "knee (1.5x idle)" in p.stdout
    p = cli("bench", "loaded-latency", "-t", "dram0", "--mix", "1:1", "--steps", "2", "--json")
    assert p.returncode == 0, p.stderr
    (doc,) = json.loads(p.stdout)
    assert doc["mix"] == "1:1" and doc["reads"] == 1 and doc["writes"] == 1
    for args, words in ((["--mix", "5:1"], "mix '5:1'"), (["--rates", "x"], "GB/s"),
                        (["--steps", "1"], "1"), (["--load-threads", "99"], "load threads"),
                        (["--target", "gpu0"], "GPU memory")):  # fmt: skip
        full = ["bench", "loaded-latency", "-t", "dram0", *args]
        p = cli(*full)
        assert p.returncode in (2, 4), (args, p.stderr)
        assert words in p.stderr, (args, p.stderr)
    p = cli("bench", "bandwidth", "-t", "dram0", "--mix", "all")
    assert p.returncode == 0, p.stderr
    for mix in loaded.MIXES:
        assert f" {mix} " in p.stdout
