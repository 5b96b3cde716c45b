"""Every op class a training or inference step uses, with its operands on a tier, gives
HBM's results (on the GPU machine; dram0 stands for the tier): GEMMs in each dtype and
with cuBLASLt's epilogues, SDPA's three kernels, embedding, layer norm, GELU and SiLU,
cross-entropy, fused AdamW, clipping's foreach norm and a compiled graph. Each case runs
twice in this process, once in HBM and once with every input made inside ``on_tier``,
and the outputs must be equal (bitwise: the same kernels read the same bytes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import pycxl
from pycxl.numa import pages

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = torch.nn.functional


def _inputs(seed: int, shapes: list[tuple[int, ...]], dtype: Any) -> list[Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(s, device="cuda", dtype=dtype, generator=g) for s in shapes]


def _same_on_tier(op: Callable[..., Any], shapes: list[tuple[int, ...]], dtype: Any) -> None:
    node = pycxl.tier_pool("dram0").node
    hbm_in = _inputs(0, shapes, dtype)
    with pycxl.on_tier("dram0"):  # before the op, which may change its inputs in place
        tier_in = [x.clone() for x in hbm_in]
    want = op(*hbm_in)
    for x in tier_in:  # the operands really are host memory on the tier's node
        assert pages.span_by_node(x.data_ptr(), x.numel() * x.element_size()) \
            .keys() == {node}  # fmt: skip
    got = op(*tier_in)
    torch.cuda.synchronize()
    for w, g in zip(_flat(want), _flat(got), strict=True):
        assert torch.equal(w, g), (op, dtype, (w.float() - g.float()).abs().max())


def _flat(x: Any) -> list[Any]:
    return [t for t in (x if isinstance(x, (tuple, list)) else [x]) if torch.is_tensor(t)]


@pytest.mark.parametrize("dtype", ["float32", "tf32", "float16", "bfloat16"])
def test_gemms_read_and_write_the_tier(dtype: str) -> None:
    dt = torch.float32 if dtype == "tf32" else getattr(torch, dtype)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        _same_on_tier(torch.matmul, [(1024, 4096), (4096, 2048)], dt)
        _same_on_tier(F.linear, [(8, 512, 1024), (4096, 1024), (4096,)], dt)  # bias epilogue
        _same_on_tier(lambda a, b, c: torch.addmm(c, a, b), [(512, 1024), (1024, 768), (768,)],
                      dt)  # fmt: skip
        _same_on_tier(lambda a, b, c: torch._addmm_activation(c, a, b, use_gelu=True),
                      [(512, 1024), (1024, 768), (768,)], dt)  # fmt: skip
        _same_on_tier(torch.bmm, [(16, 256, 128), (16, 128, 256)], dt)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("kernel", ["flash", "efficient", "math"])
def test_attention_kernels_read_the_tier(kernel: str) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "math": SDPBackend.MATH}[kernel]  # fmt: skip
    with sdpa_kernel(backend):
        _same_on_tier(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                      [(2, 8, 512, 64)] * 3, torch.bfloat16)  # fmt: skip


def test_elementwise_norm_embedding_and_loss_read_the_tier() -> None:
    bf = torch.bfloat16
    _same_on_tier(lambda x, w, b: F.layer_norm(x, (1024,), w, b), [(4, 256, 1024), (1024,),
                  (1024,)], bf)  # fmt: skip
    _same_on_tier(F.gelu, [(4, 256, 4096)], bf)
    _same_on_tier(F.silu, [(4, 256, 4096)], bf)
    _same_on_tier(lambda w: F.embedding(torch.arange(0, 4096, 3, device="cuda") % 5000, w),
                  [(5000, 1024)], torch.float32)  # fmt: skip
    _same_on_tier(lambda x: F.cross_entropy(x, torch.arange(2048, device="cuda") % 32000),
                  [(2048, 32000)], torch.float32)  # fmt: skip


def test_a_backward_pass_and_fused_adamw_on_the_tier() -> None:
    def step(w: Any, x: Any) -> tuple[Any, ...]:
        w = w.detach().requires_grad_()
        loss = (F.gelu(x @ w) ** 2).mean()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_([w], 0.5, foreach=True)
        opt = torch.optim.AdamW([w], lr=1e-2, fused=True)
        opt.step()
        opt.step()
        st = opt.state[w]
        return loss, norm, w.detach(), st["exp_avg"], st["exp_avg_sq"]

    _same_on_tier(step, [(1024, 1024), (256, 1024)], torch.float32)


def test_a_compiled_graph_reads_the_tier() -> None:
    f = torch.compile(lambda a, b: F.silu(a @ b) * a.sum(), dynamic=False)
    _same_on_tier(f, [(256, 256), (256, 256)], torch.float32)


def test_cublas_workspace_made_inside_on_tier_works() -> None:
    """A stream's first GEMM makes its cuBLAS workspace; made inside ``on_tier`` it is tier
    memory, and the GEMM must still run (and give HBM's answer)."""
    a, b = _inputs(3, [(2048, 2048), (2048, 2048)], torch.bfloat16)
    want = a @ b
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), pycxl.on_tier("dram0"):
        got = a @ b
    s.synchronize()
    assert torch.equal(want, got)
