"""Benchmarks on this machine's DRAM with small sizes: they run, validate, report sane
numbers, and put their pages on the target node. (Speed is measured by the scripts in
benchmarks/, as ratios against reference tools, never here. The commands with their
default sizes run in tests/smoke.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pycxl import bench
from pycxl.base.errors import InvalidRequestError, NotFoundError
from pycxl.base.sysfs import Sysfs
from pycxl.measure.conditions import last_level_cache
from pycxl.measure.results import BandwidthResult, LatencyResult, bench_result_json
from tests.kernel.kernel_helpers import pycxl_cli

MiB = 1 << 20


def test_latency_in_cache_is_below_latency_in_dram() -> None:
    (small,) = bench.measure_latency("dram0", size="16K", samples=3, loads=1 << 20)
    (big,) = bench.measure_latency("dram0", size=128 * MiB, samples=3, loads=1 << 21)
    for r in (small, big):
        assert isinstance(r, LatencyResult) and r.node == 0
        assert 0 < r.latency_ns <= r.latency_ns_median
    assert small.latency_ns < 5 < big.latency_ns
    assert big.latency_ns > 3 * small.latency_ns
    assert big.pages_on_node == big.pages == 128 * MiB // 4096


def test_stream_kernels_validate_and_count_bytes() -> None:
    results = bench.measure_bandwidth("dram0", size="16M", samples=2)
    assert [r.kernel for r in results if isinstance(r, BandwidthResult)] == [
        "copy", "scale", "add", "triad",
    ]  # fmt: skip
    for r in results:
        assert isinstance(r, BandwidthResult)
        assert 1e8 < r.bytes_per_s < 1e13
        assert r.bytes_per_s >= r.bytes_per_s_median
        assert r.pages_on_node == r.pages == 3 * 16 * MiB // 4096
    (nt,) = bench.measure_bandwidth("dram0", size=16 * MiB, samples=2, kernel="triad",
                                    nt_stores=True)  # fmt: skip
    assert isinstance(nt, BandwidthResult) and nt.nt_stores and nt.bytes_per_s > 1e8


def test_first_touch_distribution() -> None:
    (r,) = bench.measure_first_touch("dram0", size="8M")
    assert 0 < r.p50_ns <= r.p90_ns <= r.p99_ns <= r.max_ns
    assert r.bytes_per_s > 1e7 and r.pages_on_node == 8 * MiB // 4096


def test_last_level_cache_reads_only_cache_directories(trees: Path, tmp_path: Path) -> None:
    """The recorded kernel keeps a uevent file beside cpuN/cache/index*: not a cache."""
    tree = trees / "two-dev/fresh"
    assert (tree / "sys/devices/system/cpu/cpu0/cache/uevent").is_file()
    # the guest's L3: 16 MiB shared by CPUs 0-1, counted once
    assert last_level_cache(Sysfs(tree)) == 16 << 20
    # no cache directory at all: the C library's answer, else 32 MiB
    (tmp_path / "sys/devices/system/cpu/cpu0/cache").mkdir(parents=True)
    assert last_level_cache(Sysfs(tmp_path)) > 0


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: bench.measure_latency("cxl9", size=MiB), NotFoundError, "unknown target 'cxl9'"),
        (lambda: bench.measure_latency("dram0", size=1 << 50), InvalidRequestError, "does not fit"),
        (lambda: bench.measure_latency("dram0", size="1K"), InvalidRequestError,
         "at least 16 KiB"),
        (lambda: bench.measure_latency("dram0", samples=0), InvalidRequestError,
         "samples must be at least 1"),
        (lambda: bench.measure_latency("dram0", size="lots"), InvalidRequestError,
         "cannot read size 'lots'"),
        (lambda: bench.measure_bandwidth("dram0", threads=999, size=MiB), InvalidRequestError,
         "999 threads but initiator dram0 has"),
        (lambda: bench.measure_bandwidth("dram0", size=MiB, kernel="nope"), InvalidRequestError,
         "kernel 'nope'"),
        (lambda: bench.measure_latency("dram0", initiator="cpu999"), NotFoundError,
         "unknown target 'cpu999'"),
        (lambda: bench.measure_transfer("gpu0", "dram0", direction="up"), InvalidRequestError,
         "direction 'up'"),
        (lambda: bench.measure_first_touch("dram0", page="1g"), InvalidRequestError,
         "page size '1g'"),
    ],
)  # fmt: skip
def test_bad_input(call: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()  # type: ignore[operator]


def test_results_json_have_typed_fields() -> None:
    (r,) = bench.measure_latency("dram0", size="64K", samples=2, loads=1 << 16)
    doc = bench_result_json(r)
    assert doc["benchmark"] == "latency" and doc["latency_ns"] == r.latency_ns
    assert doc["pages_on_node"] == doc["pages"] == 16
    assert set(doc) >= {"target", "node", "initiator", "cpus", "size", "page_size", "samples"}


def test_cli_json() -> None:
    p = pycxl_cli("bench", "latency", "--target", "dram0", "--size", "1M", "--json")
    assert p.returncode == 0, p.stderr
    (doc,) = json.loads(p.stdout)
    assert doc["benchmark"] == "latency" and doc["latency_ns"] > 0 and doc["target"] == "dram0"
    assert p.stderr == ""
    p = pycxl_cli("bench", "bandwidth", "-t", "dram0", "--size", "4M", "--samples", "2",
                  "--kernel", "triad", "--json")  # fmt: skip
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
    cells = {(r["matrix"], r["initiator"], r["target"]) for r in json.loads(p.stdout)}
    assert cells == {("latency", "dram0", "dram0"), ("bandwidth", "dram0", "dram0")}
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
        ["bandwidth", "--from", "gpu0", "--target", "dram0"],
    ],
)
def test_gpu_benchmarks_without_a_cuda_driver_say_so(args: list[str]) -> None:
    from pycxl.base._lib.libs import LIBCUDA
    from pycxl.pci.devices import nvidia_gpus

    if LIBCUDA.available():
        pytest.skip("a CUDA driver is present: the GPU tests cover these")
    p = pycxl_cli("bench", *args)
    if nvidia_gpus() or "all" in args:  # a GPU there without its driver, or every GPU
        assert p.returncode == 4 and "no CUDA driver" in p.stderr, p.stderr
    else:  # gpu0 names no GPU on this machine's PCI bus: a target that does not exist
        assert p.returncode == 5 and "the PCI bus shows 0 NVIDIA GPUs" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["latency", "--from", "dram0", "--target", "gpu0"], "dram0 cannot load from GPU memory"),
        (["transfer", "--gpu", "gpu0", "-t", "dram0", "--staged", "--direction", "bidir"],
         "staged copies block the host"),
        (["transfer", "--gpu", "all", "-t", "dram0", "--pageable"],
         "pageable copies block the host"),
        (["transfer", "--gpu", "gpu0", "-t", "dram0", "--pageable", "--staged"], "choose one"),
        (["matrix", "--no-latency"], "leave nothing to measure"),
        (["latency", "-t", "dram0", "--samples", "0"], "must be at least 1, not 0"),
        (["latency", "-t", "dram0", "--size", "0"], "'0' is too small"),
        (["bandwidth", "-t", "dram0", "--threads", "abc"], "expected whole numbers"),
        (["bandwidth", "-t", "dram0", "--threads", "0"], "0 is below 1"),
        (["first-touch", "-t", "dram0", "--size", "100"], "give at least 4.00 KiB"),
    ],
)  # fmt: skip
def test_requests_that_cannot_work_are_usage_errors(args: list[str], message: str) -> None:
    p = pycxl_cli("bench", *args)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert p.stderr.startswith("pycxl: error: ") and "Traceback" not in p.stderr


def test_plot_draws_a_sweep(tmp_path: Path) -> None:
    png = tmp_path / "sweep.png"
    p = pycxl_cli("bench", "latency", "-t", "dram0", "--sweep", "--size", "64K", "--plot", str(png))
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    p = pycxl_cli(
        "bench", "bandwidth", "-t", "dram0", "--threads", "1,2", "--size", "4M",
        "--kernel", "triad", "--samples", "2", "--plot", str(png),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
