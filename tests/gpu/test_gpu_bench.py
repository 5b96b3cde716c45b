"""GPU benchmarks and the staged copier, on the GPU machine: the GPU's chase in its own
memory and through host memory, the pipelined pageable copy, copies at once (bidir,
every GPU), and the matrix with GPUs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pycxl import bench
from pycxl.base.errors import InvalidRequestError
from pycxl.gpu.context import GpuContext
from pycxl.gpu.memory import DeviceMemory
from pycxl.gpu.staged import StagedCopier
from pycxl.measure.results import TransferResult
from pycxl.resolve.system import snapshot
from tests.kernel.kernel_helpers import pycxl_cli

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def test_gpu_chase_in_cache_hbm_and_host_memory() -> None:
    s = snapshot()  # one snapshot for all three: the dispatcher resolves against it
    (l1,) = bench.measure_latency("gpu0", size="16K", samples=3, loads=1 << 14, system=s)
    (hbm,) = bench.measure_latency("gpu0", size="512M", samples=3, loads=1 << 16, system=s)
    (host,) = bench.measure_latency("dram0", "gpu0", size="64M", samples=3, loads=1 << 14,
                                    system=s)  # fmt: skip
    for r in (l1, hbm, host):
        assert r.benchmark == "latency" and r.initiator == "gpu0" and r.gpu
        assert 0 < r.latency_ns <= r.latency_ns_median
    assert l1.target == hbm.target == "gpu0" and l1.node is None
    # a GPU's L1 answers in tens of ns, its HBM in hundreds, host memory over the link later
    assert l1.latency_ns < 100 < hbm.latency_ns < 2000
    assert host.latency_ns > hbm.latency_ns
    node = s.resolve("dram0").node
    assert host.target == "dram0" and host.node == node
    assert host.pages_on_node == host.pages == 64 * MiB // 4096


def test_gpu_latency_bad_input() -> None:
    with pytest.raises(InvalidRequestError, match="samples must be at least 1"):
        bench.measure_latency("gpu0", samples=0)
    p = pycxl_cli("bench", "latency", "--from", "dram0", "--target", "gpu0")
    assert p.returncode == 2 and "cannot load from GPU memory" in p.stderr
    p = pycxl_cli("bench", "latency", "--from", "gpu0", "--target", "gpu7")
    assert p.returncode == 5 and "unknown target 'gpu7'" in p.stderr


@pytest.mark.parametrize("size", [3 * MiB + 12345, 40 * MiB])
def test_staged_copier_round_trip(size: int) -> None:
    ctx = GpuContext(0)
    data = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
    back = np.zeros_like(data)
    dev = DeviceMemory(ctx, size)
    with StagedCopier(ctx, chunk=MiB, depth=3) as copier:
        copier.to_device(dev, data)
        copier.to_host(back, dev)
    assert np.array_equal(back, data)
    dev.close()


def test_staged_copier_bad_input() -> None:
    ctx = GpuContext(0)
    with pytest.raises(InvalidRequestError, match="depth must be at least 2"):
        StagedCopier(ctx, depth=1)
    with pytest.raises(InvalidRequestError, match="multiple of 4096"):
        StagedCopier(ctx, chunk=1000)


def test_transfer_staged_bidir_and_all_gpus() -> None:
    staged = bench.measure_transfer("gpu0", "dram0", size="64M", memory="staged", samples=3)
    assert [r.direction for r in staged] == ["h2d", "d2h"]
    for r in staged:
        assert r.memory == "staged" and r.bytes_per_s > 1e9 and r.copy_threads
    (bidir,) = bench.measure_transfer("gpu0", "dram0", direction="bidir", size="64M", samples=3)
    assert bidir.direction == "bidir"
    assert [lane.direction for lane in bidir.lanes] == ["h2d", "d2h"]
    assert bidir.pages_on_node == bidir.pages == 2 * 64 * MiB // 4096
    assert bidir.bytes_per_s > 1e9 and all(lane.bytes_per_s > 1e9 for lane in bidir.lanes)
    # copies at once: each measured alone too (PCIe is full duplex: neither halves)
    for lane in bidir.lanes:
        assert lane.alone_bytes_per_s is not None and lane.alone_bytes_per_s > 1e9
        assert lane.bytes_per_s > 0.5 * lane.alone_bytes_per_s
    assert all(lane.alone_bytes_per_s is None for r in staged for lane in r.lanes)
    p = pycxl_cli("bench", "transfer", "-g", "gpu0", "-t", "dram0", "--direction", "bidir",
                  "--size", "64M")  # fmt: skip
    assert p.returncode == 0 and p.stdout.count(" alone (") == 2, p.stdout + p.stderr
    (every,) = bench.measure_transfer("all", "dram0", direction="h2d", size="64M", samples=3)
    assert every.initiator == "all" and every.bytes_per_s > 1e9
    assert len(every.lanes) == len(snapshot().gpus.devices)


def test_loaded_latency_with_every_gpu_loading() -> None:
    """--load-from all: every GPU's copy engines load dram0 at once while a CPU chases."""
    names = ",".join(g.target_name for g in snapshot().gpus.devices)
    (r,) = bench.measure_loaded_latency("dram0", load_from="all", size="8M", load_size="256M",
                                        seconds=0.2, steps=3)  # fmt: skip
    assert r.load_from == names and r.mix == "read"
    assert r.load_pages_on_node == r.load_pages > 0
    assert r.peak_bytes_per_s > 5e9  # one H200 alone moves ~50 GB/s host to device
    assert all(p.latency_ns_p50 > 0 for p in r.points)
    p = pycxl_cli("bench", "loaded-latency", "-t", "dram0", "--load-from", "all", "--mix", "1:1",
                  "--steps", "2", "--duration", "0.2", "--size", "8M", "--load-size", "256M",
                  "--json")  # fmt: skip
    assert p.returncode == 0, p.stderr
    (doc,) = json.loads(p.stdout)
    assert doc["load_from"] == names and doc["peak_bytes_per_s"] > 5e9


def test_a_gpu_reads_host_memory_by_copying_it() -> None:
    """bench bandwidth --from gpu0 --target dram0: the matrix's cell, from the CLI too."""
    (r,) = bench.measure_bandwidth("dram0", "gpu0", size="64M", samples=3)
    assert isinstance(r, TransferResult) and r.direction == "h2d" and r.memory == "pinned"
    assert r.bytes_per_s > 1e9 and r.pages_on_node == r.pages
    p = pycxl_cli("bench", "bandwidth", "--from", "gpu0", "-t", "dram0", "--size", "64M",
                  "--json")  # fmt: skip
    assert p.returncode == 0 and json.loads(p.stdout)[0]["benchmark"] == "transfer", p.stderr


def test_matrix_has_gpu_rows_and_gpu_memory() -> None:
    p = pycxl_cli("bench", "matrix", "--bandwidth", "--size", "64M", "--json")
    assert p.returncode == 0, p.stderr
    cells = {(r["matrix"], r["initiator"], r["target"]) for r in json.loads(p.stdout)}
    m = bench.measure_matrix(size="64M", bandwidth=True)
    assert (
        m.cell("gpu0", "gpu0", "latency") is not None and m.cell("dram0", "gpu0", "latency") is None
    )
    for kind in ("latency", "bandwidth"):
        assert {(kind, "gpu0", "gpu0"), (kind, "gpu0", "dram0"), (kind, "dram0", "dram0")} <= cells
    assert not any(i == "dram0" and t.startswith("gpu") for _, i, t in cells)
    p = pycxl_cli("bench", "matrix", "--size", "64M")
    assert p.returncode == 0 and "gpu0" in p.stdout
