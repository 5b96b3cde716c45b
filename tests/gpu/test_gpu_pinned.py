"""Pinned memory on a tier for PyTorch and numpy, on the GPU machine: torch treats it as
pinned, copies it by DMA, its pages stay on the node, it is freed with the tensor, and
large registrations are made in chunks that still form one range for the GPU."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError
from pycxl.gpu.context import GpuContext
from pycxl.gpu.memory import HostMemory
from pycxl.resolve.system import snapshot

pytestmark = pytest.mark.gpu
MiB = 1 << 20


def _host_of(address: int) -> HostMemory:
    """The registration behind a pinned tensor's memory (a tensor's numpy view points
    back at the tensor, not at what owns its memory)."""
    from pycxl.byname.facade import _PinnedOwner

    # type(), not isinstance(): the heap holds weak proxies, and isinstance() asks a dead
    # one for its __class__, which raises ReferenceError
    (host,) = [o.host for o in gc.get_objects()
               if type(o) is _PinnedOwner and o.host.address == address]  # fmt: skip
    assert isinstance(host, HostMemory)
    return host


def test_pinned_tensor_is_pinned_copies_both_ways_and_stays_on_its_node() -> None:
    torch = pytest.importorskip("torch")
    node = snapshot(gpus=False).resolve("dram0").node
    t = pycxl.pinned_tensor((4, MiB), torch.float32, "dram0")
    assert t.is_pinned() and t.shape == (4, MiB) and t.dtype == torch.float32
    t.copy_(torch.arange(4 * MiB, dtype=torch.float32).view(4, MiB))
    host = _host_of(t.data_ptr())
    assert host.pages_by_node() == {node: 16 * MiB // 4096}
    assert host.placement.stayed and host.placement.expected == (node,)
    dev = t.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), t)
    back = pycxl.pinned_tensor((4, MiB), torch.float32, "dram0")
    back.copy_(dev * 2, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back, t * 2)
    # bf16 has no numpy dtype: still a pinned tensor of the asked dtype
    h = pycxl.pinned_tensor(1024, torch.bfloat16, "dram0")
    assert h.dtype == torch.bfloat16 and h.is_pinned()


def test_the_tensor_frees_its_memory_when_it_goes() -> None:
    torch = pytest.importorskip("torch")
    t = pycxl.pinned_tensor(MiB, torch.uint8, "dram0")
    host = weakref.ref(_host_of(t.data_ptr()))
    assert host() is not None
    del t
    gc.collect()
    assert host() is None  # unregistered and unmapped


def test_pinned_array_and_chunked_registration() -> None:
    torch = pytest.importorskip("torch")
    a = pycxl.pinned_array((256, 1024), "float64", "dram0")
    a[:] = 1.5
    assert a.shape == (256, 1024) and a.dtype == np.float64
    node = snapshot(gpus=False).resolve("dram0").node
    with HostMemory.allocate(GpuContext(0), 64 * MiB, [node], chunk=16 * MiB) as host:
        host.array("float32")[:] = 2.0  # four registrations, one range for the GPU
        t = torch.as_tensor(host, device="cuda").view(torch.float32)
        assert float(t.sum()) == 2.0 * 16 * MiB
        assert host.pages_by_node() == {node: 64 * MiB // 4096}


def test_bad_input() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(InvalidRequestError, match="give a torch dtype"):
        pycxl.pinned_tensor(16, "float32", "dram0")
    with pytest.raises(InvalidRequestError, match="holds no element"):
        pycxl.pinned_array((0, 4), "float32", "dram0")
    with pytest.raises(InvalidRequestError, match="multiple of 4096"):
        HostMemory(GpuContext(0), pycxl.allocate(MiB, "dram0"), chunk=1000)
    assert torch is not None
