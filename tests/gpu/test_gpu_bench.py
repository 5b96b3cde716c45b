"""GPU benchmarks and the staged copier, on the GPU machine: the GPU's chase in its own
memory and through host memory, the pipelined pageable copy, copies at once (bidir,
every GPU), and the matrix with GPUs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pycxl.bench.gpu_latency import measure_gpu_latency
from pycxl.bench.transfer import measure_transfer
from pycxl.errors import InvalidRequestError
from pycxl.gpu.memory import DeviceMemory, GpuContext
from pycxl.gpu.staged import StagedCopier
from pycxl.system import snapshot
from tests.kernel.kernel_helpers import pycxl_cli

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def test_gpu_chase_in_cache_hbm_and_host_memory() -> None:
    l1 = measure_gpu_latency("gpu0", size=16 << 10, samples=3, loads=1 << 14)
    hbm = measure_gpu_latency("gpu0", size=512 * MiB, samples=3, loads=1 << 16)
    host = measure_gpu_latency("gpu0", "dram0", size=64 * MiB, samples=3, loads=1 << 14)
    for r in (l1, hbm, host):
        assert r.benchmark == "latency" and r.initiator == "gpu0"
        assert 0 < r.figures["latency_ns"] <= r.figures["latency_ns_median"]
    assert l1.target == hbm.target == "gpu0" and l1.node is None
    # a GPU's L1 answers in tens of ns, its HBM in hundreds, host memory over the link later
    assert l1.figures["latency_ns"] < 100 < hbm.figures["latency_ns"] < 2000
    assert host.figures["latency_ns"] > hbm.figures["latency_ns"]
    node = snapshot(gpus=False).resolve("dram0").node
    assert host.target == "dram0" and host.node == node
    assert host.params["pages_on_node"] == host.params["pages"] == 64 * MiB // 4096


def test_gpu_latency_bad_input() -> None:
    with pytest.raises(InvalidRequestError, match="samples must be at least 1"):
        measure_gpu_latency("gpu0", samples=0)
    p = pycxl_cli("bench", "latency", "--from", "dram0", "--target", "gpu0")
    assert p.returncode == 2 and "cannot load from GPU memory" in p.stderr


@pytest.mark.parametrize("size", [3 * MiB + 12345, 40 * MiB])
def test_staged_copier_round_trip(size: int) -> None:
    ctx = GpuContext(0)
    data = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
    back = np.zeros_like(data)
    dev = DeviceMemory(ctx, size)
    with StagedCopier(ctx, chunk=MiB, depth=3) as copier:
        copier.to_device(dev.ptr, data)
        copier.to_host(back, dev.ptr)
    assert np.array_equal(back, data)
    dev.close()


def test_staged_copier_bad_input() -> None:
    ctx = GpuContext(0)
    with pytest.raises(InvalidRequestError, match="depth must be at least 2"):
        StagedCopier(ctx, depth=1)
    with pytest.raises(InvalidRequestError, match="multiple of 4096"):
        StagedCopier(ctx, chunk=1000)


def test_transfer_staged_bidir_and_all_gpus() -> None:
    staged = measure_transfer("gpu0", "dram0", size=64 * MiB, staged=True, iterations=3)
    assert [r.params["direction"] for r in staged] == ["h2d", "d2h"]
    for r in staged:
        assert r.params["staged"] and not r.params["pinned"] and r.figures["bytes_per_s"] > 1e9
    (bidir,) = measure_transfer("gpu0", "dram0", direction="bidir", size=64 * MiB, iterations=3)
    assert bidir.params["direction"] == "bidir"
    assert [lane["direction"] for lane in bidir.params["lanes"]] == ["h2d", "d2h"]
    assert bidir.params["pages_on_node"] == 2 * 64 * MiB // 4096
    assert bidir.figures["bytes_per_s"] > 1e9
    assert all(lane["bytes_per_s"] > 1e9 for lane in bidir.params["lanes"])
    every = measure_transfer("all", "dram0", direction="h2d", size=64 * MiB, iterations=3)
    assert every[0].initiator == "all" and every[0].figures["bytes_per_s"] > 1e9
    assert len(every[0].params["lanes"]) == len(snapshot().gpus.devices)


def test_matrix_has_gpu_rows_and_gpu_memory() -> None:
    p = pycxl_cli("bench", "matrix", "--bandwidth", "--size", "64M", "--json")
    assert p.returncode == 0, p.stderr
    cells = {(r["matrix"], r["initiator"], r["target"]) for r in json.loads(p.stdout)}
    for kind in ("latency", "bandwidth"):
        assert {(kind, "gpu0", "gpu0"), (kind, "gpu0", "dram0"), (kind, "dram0", "dram0")} <= cells
    assert not any(i == "dram0" and t.startswith("gpu") for _, i, t in cells)
    p = pycxl_cli("bench", "matrix", "--size", "64M")
    assert p.returncode == 0 and "gpu0" in p.stdout
