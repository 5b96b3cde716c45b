"""Benchmarks on this machine's DRAM with small sizes: they run, validate, report sane
numbers, and put their pages on the target node. (Speed is measured by the scripts in
benchmarks/, as ratios against reference tools, never here.)"""

from __future__ import annotations

import json

import pytest

from pycxl.bench.bandwidth import measure_bandwidth
from pycxl.bench.first_touch import measure_first_touch
from pycxl.bench.latency import measure_latency
from pycxl.errors import InvalidRequestError, NotFoundError
from tests.kernel.kernel_helpers import pycxl_cli

MiB = 1 << 20


def test_latency_in_cache_is_below_latency_in_dram() -> None:
    small = measure_latency("dram0", size=16 << 10, samples=3, loads=1 << 20)
    big = measure_latency("dram0", size=128 * MiB, samples=3, loads=1 << 21)
    for r in (small, big):
        assert r.benchmark == "latency" and r.node == 0
        assert 0 < r.figures["latency_ns"] <= r.figures["latency_ns_median"]
    assert small.figures["latency_ns"] < 5 < big.figures["latency_ns"]
    assert big.figures["latency_ns"] > 3 * small.figures["latency_ns"]
    assert big.params["pages_on_node"] == big.params["pages"] == 128 * MiB // 4096


def test_stream_kernels_validate_and_count_bytes() -> None:
    results = measure_bandwidth("dram0", size=16 * MiB, ntimes=3)
    assert [r.params["kernel"] for r in results] == ["copy", "scale", "add", "triad"]
    for r in results:
        assert 1e8 < r.figures["bytes_per_s"] < 1e13
        assert r.figures["bytes_per_s"] >= r.figures["bytes_per_s_median"]
        assert r.params["pages_on_node"] == 16 * MiB // 4096
    (nt,) = measure_bandwidth("dram0", size=16 * MiB, ntimes=3, kernel="triad", nt_stores=True)
    assert nt.params["nt_stores"] and nt.figures["bytes_per_s"] > 1e8


def test_first_touch_distribution() -> None:
    r = measure_first_touch("dram0", size=8 * MiB)
    f = r.figures
    assert 0 < f["p50_ns"] <= f["p90_ns"] <= f["p99_ns"] <= f["max_ns"]
    assert f["bytes_per_s"] > 1e7 and r.params["pages_on_node"] == 8 * MiB // 4096


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: measure_latency("cxl9", size=MiB), NotFoundError, "unknown target 'cxl9'"),
        (lambda: measure_latency("dram0", size=1 << 50), InvalidRequestError, "does not fit"),
        (
            lambda: measure_bandwidth("dram0", threads=999, size=MiB),
            InvalidRequestError,
            "999 threads but initiator dram0 has",
        ),
        (
            lambda: measure_bandwidth("dram0", size=MiB, kernel="nope"),
            InvalidRequestError,
            "kernel 'nope'",
        ),
        (
            lambda: measure_latency("dram0", initiator="cpu999"),
            NotFoundError,
            "unknown target 'cpu999'",
        ),
    ],
)
def test_bad_input(call: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()  # type: ignore[operator]


def test_cli_json() -> None:
    p = pycxl_cli("bench", "latency", "--target", "dram0", "--size", "1M", "--json")
    assert p.returncode == 0, p.stderr
    (doc,) = json.loads(p.stdout)
    assert doc["benchmark"] == "latency" and doc["latency_ns"] > 0 and doc["target"] == "dram0"
    assert p.stderr == ""
    p = pycxl_cli(
        "bench",
        "bandwidth",
        "--target",
        "dram0",
        "--size",
        "4M",
        "--ntimes",
        "2",
        "--kernel",
        "triad",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)[0]["bytes_per_s"] > 0


def test_cli_sweep_and_matrix() -> None:
    p = pycxl_cli("bench", "latency", "--target", "dram0", "--sweep", "--size", "256K", "--json")
    assert p.returncode == 0, p.stderr
    sweep = json.loads(p.stdout)
    assert [r["size"] for r in sweep] == [16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10]
    assert all(r["latency_ns"] > 0 for r in sweep)
    p = pycxl_cli("bench", "matrix", "--bandwidth", "--size", "4M", "--json")
    assert p.returncode == 0, p.stderr
    cells = {(r["benchmark"], r["initiator"], r["target"]) for r in json.loads(p.stdout)}
    assert ("latency", "dram0", "dram0") in cells and ("bandwidth", "dram0", "dram0") in cells
    p = pycxl_cli("bench", "matrix", "--size", "1M")
    assert p.returncode == 0 and "latency (initiator x target)" in p.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["transfer", "--gpu", "gpu0", "--target", "dram0"],
        ["transfer", "--gpu", "all", "--target", "dram0", "--direction", "bidir"],
        ["transfer", "--gpu", "gpu0", "--target", "dram0", "--staged", "--size", "1M"],
        ["latency", "--target", "gpu0"],
        ["latency", "--from", "gpu0", "--target", "dram0"],
        ["bandwidth", "--target", "gpu0"],
    ],
)
def test_gpu_benchmarks_without_a_cuda_driver_say_so(args: list[str]) -> None:
    from pycxl._lib.libs import LIBCUDA

    if LIBCUDA.available():
        pytest.skip("a CUDA driver is present: the GPU tests cover these")
    p = pycxl_cli("bench", *args)
    assert p.returncode == 4 and "no CUDA driver (libcuda.so.1 not found)" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["latency", "--from", "dram0", "--target", "gpu0"], "dram0 cannot load from GPU memory"),
        (
            ["transfer", "--gpu", "gpu0", "-t", "dram0", "--staged", "--direction", "bidir"],
            "staged copies block the host",
        ),
        (
            ["transfer", "--gpu", "all", "-t", "dram0", "--pageable"],
            "pageable copies block the host",
        ),
        (["transfer", "--gpu", "gpu0", "-t", "dram0", "--pageable", "--staged"], "choose one"),
    ],
)
def test_gpu_benchmark_requests_that_cannot_work(args: list[str], message: str) -> None:
    p = pycxl_cli("bench", *args)
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_plot_draws_a_sweep(tmp_path: object) -> None:
    from pathlib import Path

    png = Path(str(tmp_path)) / "sweep.png"
    p = pycxl_cli("bench", "latency", "-t", "dram0", "--sweep", "--size", "64K", "--plot", str(png))
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    p = pycxl_cli(
        "bench", "bandwidth", "-t", "dram0", "--threads", "1,2", "--size", "4M",
        "--kernel", "triad", "--ntimes", "3", "--plot", str(png),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
