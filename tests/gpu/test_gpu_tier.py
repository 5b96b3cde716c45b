"""CUDA memory on a tier, on the GPU machine: a pool on dram0's node gives memory the GPU
reads and writes in place, every page on the node; PyTorch tensors land there inside
``on_tier`` and move to HBM and back; 1,000 allocate/free cycles leave nothing behind;
and a fresh process that spills (``spill_to``) keeps running where HBM is full, with
correct results and counted spills. All of it again with the pools' memory registered
(mbind + cuMemHostRegister, what drivers without host-node memory get)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import pycxl
from pycxl.numa import pages
from tests.gpu import dram0_node

pytestmark = pytest.mark.gpu
MiB = 1 << 20
GiB = 1 << 30


def test_tier_memory_is_on_the_node_and_the_gpu_reads_and_writes_it() -> None:
    torch = pytest.importorskip("torch")
    pool = pycxl.tier_pool("dram0")
    assert pool.registered == (os.environ.get("PYCXL_TIER_MEMORY") == "registered")
    with pool.allocate(256 * MiB) as mem:
        assert mem.pages_by_node() == {dram0_node(): 256 * MiB // 4096}
        t = torch.as_tensor(mem, device="cuda")  # __cuda_array_interface__: no copy
        assert t.data_ptr() == mem.ptr and t.numel() == 256 * MiB
        t.fill_(7)
        assert int(t[::4096].to(torch.int64).sum()) == 7 * (256 * MiB // 4096)
        stats = pool.stats()
        assert stats.bytes_now >= 256 * MiB and stats.misplaced_pages == 0
    assert pool.stats().bytes_now == stats.bytes_now - 256 * MiB


def test_gpu_stream_on_tier_memory_runs_in_place_near_the_links_rate() -> None:
    zero = pycxl.bench.measure_bandwidth("dram0", "gpu0", zero_copy=True, size="512M", samples=3)
    (copy,) = pycxl.bench.measure_bandwidth("dram0", "gpu0", kernel="copy", size="512M",
                                            samples=3)  # fmt: skip
    assert [r.kernel for r in zero] == ["copy", "scale", "add", "triad"]
    for r in zero:
        assert r.node == dram0_node() and r.pages_on_node == r.pages == 3 * 512 * MiB // 4096
        # reads come over the link one way and writes go back the other: STREAM's count
        # of both may pass one direction's copy rate, never two of them
        assert 0.5 * copy.bytes_per_s < r.bytes_per_s < 2.2 * copy.bytes_per_s, (r, copy)
    print(
        f"zero-copy STREAM on dram0: {[round(r.bytes_per_s / 1e9, 1) for r in zero]} GB/s; "
        f"pinned copy {copy.bytes_per_s / 1e9:.1f} GB/s"
    )


def test_tensors_in_on_tier_live_on_the_node_and_move_to_hbm_and_back() -> None:
    torch = pytest.importorskip("torch")
    pool = pycxl.tier_pool("dram0")
    before = pool.stats().bytes_now
    with pycxl.on_tier("dram0"):
        x = torch.arange(64 * MiB, dtype=torch.float32, device="cuda")
    assert pool.stats().bytes_now >= before + x.numel() * 4
    assert pages.span_by_node(x.data_ptr(), x.numel() * 4) == {dram0_node(): 64 * MiB * 4 // 4096}
    y = pycxl.move(x, "gpu0")
    assert torch.equal(x, y) and y.data_ptr() != x.data_ptr()
    z = pycxl.move(y, "dram0")
    assert torch.equal(z, x)
    (x @ torch.ones(1, device="cuda").expand(64 * MiB)).item()  # a kernel reads it in place


def test_a_thousand_allocations_and_frees_leave_nothing() -> None:
    pytest.importorskip("torch")
    from pycxl.gpu.context import GpuContext

    pool = pycxl.tier_pool("dram0")
    ctx = GpuContext(0)
    for _ in range(20):  # the pool has taken what it needs
        pool.allocate(8 * MiB).close()
    pool.trim()
    driver_free, in_use = ctx.free_memory(), pool.stats().bytes_now
    for _ in range(1000):
        pool.allocate(8 * MiB).close()
    pool.trim()
    assert pool.stats().bytes_now == in_use
    assert abs(ctx.free_memory() - driver_free) < 64 * MiB


SPILL = """
import json, torch, pycxl
from pycxl.numa import pages
pool = pycxl.spill_to("dram0", log=True)
free, _ = torch.cuda.mem_get_info()
blocker = torch.empty(free - 10 * (1 << 30), dtype=torch.uint8, device="cuda")
xs = [torch.ones(1 << 30, dtype=torch.float32, device="cuda") for _ in range(5)]  # 4 GiB each
where = [pages.span_by_node(x.data_ptr(), 4096).get(NODE, 0) for x in xs]
a = torch.randn(4096, 4096, device="cuda")
with pycxl.on_tier(pool):
    b = torch.randn(4096, 4096, device="cuda")
ok = torch.allclose(a @ b, a @ b.clone().to("cuda"))
s = pool.stats()
print(json.dumps({"on_node": where, "sums": [float(x.sum()) for x in xs], "ok": bool(ok),
                  "spilled_now": s.bytes_now, "allocations": s.allocations,
                  "gpu_refusals": s.gpu_refusals, "misplaced": s.misplaced_pages}))
"""


def test_a_process_that_spills_runs_on_where_hbm_is_full() -> None:
    pytest.importorskip("torch")
    code = textwrap.dedent(SPILL).replace("NODE", str(dram0_node()))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["ok"]
    assert out["sums"] == [float(1 << 30)] * 5
    spilled = [n > 0 for n in out["on_node"]]
    assert 1 <= spilled.count(True) <= 4 and spilled == sorted(spilled), out  # HBM first
    assert out["gpu_refusals"] >= spilled.count(True) and out["misplaced"] == 0
    assert out["spilled_now"] >= spilled.count(True) * 4 * GiB
    assert "spilled 4294967296 bytes to dram0 at <string>:" in p.stderr, p.stderr[-2000:]


def test_registered_memory_passes_the_same_tests() -> None:
    if os.environ.get("PYCXL_TIER_MEMORY") == "registered":
        pytest.skip("this is the registered run")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        "-s", __file__],
                       capture_output=True, text=True, timeout=600, check=False,
                       env={**os.environ, "PYCXL_TIER_MEMORY": "registered"})  # fmt: skip
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    print(p.stdout[-1500:])
