"""Host memory pinned and registered for the GPU, on the GPU machine: data round trip,
pages stay on their node, zero-copy use through __cuda_array_interface__, bad input."""

from __future__ import annotations

import numpy as np
import pytest

import pycxl
from pycxl import bench
from pycxl.base.errors import InvalidRequestError, NotFoundError
from pycxl.gpu.context import GpuContext
from pycxl.gpu.memory import DeviceMemory, HostMemory
from pycxl.gpu.streams import Stream
from pycxl.resolve.system import snapshot

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def test_round_trip_through_the_gpu_keeps_pages_on_their_node() -> None:
    node = snapshot(gpus=False).resolve("dram0").node
    ctx = GpuContext(0)
    src, dst = pycxl.allocate("16M", "dram0"), pycxl.allocate("16M", "dram0")
    data = np.random.default_rng(1).integers(0, 255, 16 * MiB, dtype=np.uint8)
    src.array()[:] = data
    with HostMemory(ctx, src) as a, HostMemory(ctx, dst) as b:
        assert a.device_pointer and a.pages_by_node() == {node: 16 * MiB // 4096}
        dev = DeviceMemory(ctx, 16 * MiB)
        dev.copy_from_host(a)
        stream = Stream(ctx)
        dev.copy_to_host(b, stream=stream)  # asynchronous: done once the stream is
        stream.synchronize()
        assert np.array_equal(dst.array(), data)
        assert b.pages_by_node() == {node: 16 * MiB // 4096}
        with pytest.raises(InvalidRequestError, match="do not fit in"):
            dev.copy_from_host(a, offset=4096)
        stream.close()
        dev.close()


def test_zero_copy_from_torch_reads_the_host_buffer() -> None:
    torch = pytest.importorskip("torch")
    ctx = GpuContext(0)
    buf = pycxl.allocate("4M", "dram0")
    buf.array()[:] = 3
    with HostMemory(ctx, buf) as reg:
        t = torch.as_tensor(reg, device="cuda")  # no copy: the GPU reads host memory
        assert t.data_ptr() == reg.device_pointer
        assert int(t.sum(dtype=torch.int64)) == 3 * 4 * MiB


def test_allocate_pinned_on_a_tier_with_a_numpy_view() -> None:
    torch = pytest.importorskip("torch")
    node = snapshot(gpus=False).resolve("dram0").node
    host = pycxl.host_memory("8M", "dram0", gpu="gpu0")
    view = host.array("float32")
    view[:] = 0.5
    assert host.pages_by_node() == {node: 8 * MiB // 4096}
    t = torch.as_tensor(host, device="cuda").view(torch.float32)  # zero-copy
    assert float(t.sum()) == 0.5 * view.size
    t[:4] = 2.0  # a GPU write lands in host memory
    torch.cuda.synchronize()
    assert list(view[:5]) == [2.0, 2.0, 2.0, 2.0, 0.5]
    del t, view
    host.close()  # unregisters and frees
    with pytest.raises(NotFoundError):
        pycxl.host_memory(MiB, "node99")
    with HostMemory.allocate(GpuContext(0), MiB, [node]) as by_id:  # the id floor
        assert by_id.pages_by_node() == {node: MiB // 4096}


def test_bad_input() -> None:
    ctx = GpuContext(0)
    buf = pycxl.allocate(MiB, "dram0")
    with HostMemory(ctx, buf), pytest.raises(InvalidRequestError, match="already registered"):
        HostMemory(ctx, buf)
    with pytest.raises(InvalidRequestError, match="page boundary"):
        HostMemory(ctx, np.ones(1000))
    with pytest.raises(InvalidRequestError, match="do not fit in the GPU's free memory"):
        DeviceMemory(ctx, 1 << 50)
    with pytest.raises(NotFoundError, match="unknown target 'gpu7'"):
        bench.measure_transfer("gpu7", "dram0", size=MiB)


def test_transfer_benchmark_runs_both_ways() -> None:
    results = bench.measure_transfer("gpu0", "dram0", size="64M", samples=3)
    assert [r.direction for r in results] == ["h2d", "d2h"]
    for r in results:
        assert 1e9 < r.bytes_per_s < 1e12 and r.memory == "pinned"
        assert r.pages_on_node == r.pages == 64 * MiB // 4096


def test_gpu_stream_kernels_run_and_validate() -> None:
    results = bench.measure_bandwidth("gpu0", size="64M", samples=2)
    assert [getattr(r, "kernel", None) for r in results] == ["copy", "scale", "add", "triad"]
    for r in results:
        assert 1e10 < getattr(r, "bytes_per_s", 0) < 1e13  # validated inside, like STREAM
