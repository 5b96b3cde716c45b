"""Layer streaming on the GPU machine: the prefetch ring on the CUDA driver with
PyTorch's streams (compute slowed on purpose, so a missing wait shows as wrong bytes),
LayerOffload training and inference equal to plain PyTorch, host memory on the node,
and bench offload's figures."""

from __future__ import annotations

import functools
from typing import Any

import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError
from pycxl.gpu.context import GpuContext
from pycxl.gpu.cuda_engine import CudaEngine
from pycxl.gpu.prefetch import Prefetcher
from pycxl.resolve.system import snapshot

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
MiB = 1 << 20


def _node() -> int:
    node = snapshot(gpus=False).resolve("dram0").node
    assert node is not None
    return node


@pytest.mark.parametrize("lookahead", [0, 1, 3])
def test_the_ring_serves_each_item_intact_while_the_compute_stream_lags(lookahead: int) -> None:
    n = 6
    items = [pycxl.pinned_tensor(4 * MiB + 4096 * i, torch.uint8, "dram0") for i in range(n)]
    for i, t in enumerate(items):
        t.fill_(i + 1)
    ring = Prefetcher(CudaEngine(GpuContext(0)), items, lookahead=lookahead)
    stream = torch.cuda.current_stream()
    sums = []
    for _ in range(3):
        for i in range(n):
            view = ring.get(i, stream)
            torch.cuda._sleep(2_000_000)  # the compute stream lags: copies run ahead
            dev = torch.as_tensor(view, device="cuda")
            sums.append((i, dev.sum(dtype=torch.int64), dev.numel()))
            ring.done(i, stream)
    torch.cuda.synchronize()
    for i, s, numel in sums:
        assert numel == items[i].numel() and int(s) == (i + 1) * numel
    # each use copied once, plus the look-ahead across the end of the last pass
    assert ring.stats.copies_in == 3 * n + lookahead and ring.stats.reused == 0
    ring.close()


def test_the_ring_works_with_cupy_streams_and_arrays() -> None:
    cp = pytest.importorskip("cupy")
    items = [pycxl.pinned_array(MiB, "uint8", "dram0") for _ in range(4)]
    for i, a in enumerate(items):
        a[:] = i + 1
    ring = Prefetcher(CudaEngine(GpuContext(0)), items, lookahead=1)
    stream = cp.cuda.Stream(non_blocking=True)
    sums = []
    with stream:
        for _ in range(2):
            for i in range(4):
                dev = cp.asarray(ring.get(i, stream))  # no copy: the ring's buffer
                sums.append((i, dev.sum(dtype=cp.int64)))
                ring.done(i, stream)
    stream.synchronize()
    assert [(i, int(s)) for i, s in sums] == [(i, (i + 1) * MiB) for i in range(4)] * 2
    ring.close()


def test_the_ring_refuses_pageable_host_memory() -> None:
    pageable = torch.zeros(MiB, dtype=torch.uint8)
    with pytest.raises(InvalidRequestError, match="not pinned"):
        Prefetcher(CudaEngine(GpuContext(0)), [pageable])


def _model(layers: int = 4, width: int = 256) -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[
        torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
        for _ in range(layers)
    ]).cuda()  # fmt: skip


def _train(model: Any, steps: int, opt: Any = None) -> list[float]:
    g = torch.Generator(device="cuda").manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 256, device="cuda", generator=g)
        y = torch.randn(64, 256, device="cuda", generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        losses.append(float(loss))
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return losses


ADAM = functools.partial(torch.optim.Adam, lr=1e-2)


@pytest.mark.parametrize("weights", ["stream", "resident"])
def test_offloaded_training_equals_plain_pytorch(weights: str) -> None:
    model, ref = _model(), _model()
    offload = pycxl.offload_layers(list(model), "dram0", "gpu0", weights=weights, optimizer=ADAM)
    got = _train(model, 5)
    offload.synchronize()
    want = _train(ref, 5, ADAM(ref.parameters()))
    assert got == pytest.approx(want, rel=1e-4)
    if weights == "resident":
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            # the CPU step and CUDA's round apart; Adam magnifies that where |g| ~ eps
            assert torch.allclose(p, q, atol=1e-4)
    else:
        # between uses each parameter is its home, on the tier: no GPU memory held
        assert all(p.device.type == "cpu" and p.is_pinned() for p in model.parameters())
        with torch.no_grad():
            x = torch.randn(8, 256, device="cuda")
            assert torch.allclose(model(x), ref(x), atol=1e-5)
        assert offload.stats().reused > 0
    node = _node()
    pages = offload.pages_by_node()
    assert set(pages) == {node} and pages[node] > 0
    offload.close()


def test_a_stream_of_bf16_layers_holds_only_the_ring_on_the_gpu() -> None:
    layers = [torch.nn.Linear(4096, 4096, bias=False, dtype=torch.bfloat16) for _ in range(8)]
    ref = [torch.nn.Linear(4096, 4096, bias=False, dtype=torch.bfloat16) for _ in range(8)]
    for a, b in zip(layers, ref, strict=True):
        b.weight.data.copy_(a.weight.data)
        b.cuda()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    offload = pycxl.offload_layers(layers, "dram0", "gpu0", lookahead=1)
    x = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        h, r = x, x
        for a, b in zip(layers, ref, strict=True):
            h, r = torch.relu(a(h)), torch.relu(b(r))
    assert torch.equal(h, r)
    # two ring buffers are the driver's (not PyTorch's): PyTorch holds no layer
    assert torch.cuda.memory_allocated() - before < 4096 * 4096 * 2
    offload.close()


def test_bench_offload_reports_sane_figures_for_every_mode() -> None:
    results = pycxl.bench.measure_offload("dram0", "gpu0", layers=4, width=2048, tokens=256,
                                          samples=2)  # fmt: skip
    assert [r.mode for r in results] == ["hbm", "pycxl", "to", "pinned"]
    hbm, *host = results
    assert hbm.node is None and hbm.pages is None
    for r in host:
        assert r.pages_on_node == r.pages and r.pages
        assert r.node == _node()
        assert 0.5 < r.vs_bound < 100 and r.step_s > 0
        assert r.link_bytes_per_s is not None and r.link_bytes_per_s < 2 * r.pinned_h2d_bytes_per_s
    back = pycxl.bench.measure_offload("dram0", "gpu0", layers=4, width=2048, tokens=256,
                                       samples=2, backward=True, modes="pycxl")  # fmt: skip
    streamed = back[1]
    # two buffers: of 8 uses a step, the two layers at each turn are still there
    assert streamed.bytes_to_device == (2 * 4 - 4) * 2048 * 2048 * 2
    assert streamed.bytes_to_host == 4 * 2048 * 2048 * 2


def test_bench_offload_times_the_update_against_the_bound_of_its_split() -> None:
    results = pycxl.bench.measure_offload("dram0", "gpu0", layers=4, width=2048, tokens=256,
                                          samples=3, backward=True, modes="update")  # fmt: skip
    assert [r.mode for r in results] == ["hbm", "update"]
    update = results[1]
    assert sorted(update.update_cpu_blocks + update.update_gpu_blocks) == [0, 1, 2, 3]
    assert update.update_cpu_rate > 1e8 and update.update_gpu_rate > 1e8  # parameters/s
    assert 0.8 < update.vs_bound < 10 and update.bound_s > 0
    assert update.pages_on_node == update.pages and update.pages
    assert (
        pycxl.bench.measure_offload(
            "dram0", "gpu0", layers=2, width=1024, tokens=64, samples=1, backward=True
        )[-1].mode
        == "update"
    )  # with the backward pass, the update is run unasked


def test_every_gpu_at_once_runs_each_alone_first_and_says_the_cost_of_sharing() -> None:
    n = len(snapshot().gpus.devices)
    results = pycxl.bench.measure_offload("dram0", "all", layers=4, width=2048, tokens=256,
                                          samples=2)  # fmt: skip
    alone = [r for r in results if r.alone_s is None]
    together = [r for r in results if r.alone_s is not None]
    assert [r.mode for r in alone] == ["hbm", "pycxl"] * n
    assert len(together) == n and all(r.at_once == n for r in together)
    for r in together:
        assert r.pages_on_node == r.pages and r.step_s > 0 and r.alone_s > 0
        if n == 1:  # alone and "at once" are the same run twice
            assert 0.5 < r.step_s / r.alone_s < 2


@pytest.mark.gpus(2)
def test_two_gpus_streaming_from_one_tier_each_get_part_of_the_link() -> None:
    results = pycxl.bench.measure_offload("dram0", "all", layers=8, width=4096, tokens=256)
    together = [r for r in results if r.alone_s is not None]
    assert len(together) >= 2
    total = sum(r.link_bytes_per_s or 0 for r in together)
    single = max(r.pinned_h2d_bytes_per_s for r in together)
    assert total > single  # more than one link's worth moves, however they share the host
