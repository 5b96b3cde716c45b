"""pycxl.fit on the GPU machine: the rates it measures here (the CPU update and the
link alone and beside each other, the GPU's matrix multiply) are this machine's, and
the bound it gives carries the update that begins at step()."""

from __future__ import annotations

import gc

import pytest

import pycxl
from tests.training import checkpointing_on

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def test_fit_measures_the_rates_alone_and_beside_each_other_here() -> None:
    shape = pycxl.TrainShape.decoder(layers=8, hidden=2048)
    planned = pycxl.fit(shape, "dram0", "gpu0", tokens=2048)
    m = planned.machine
    assert m.hbm_free and m.link and m.cpu_update and m.gpu_flops and m.shared, m
    cpu, link = m.shared
    assert 0 < cpu <= m.cpu_update and 0 < link <= m.link, m
    assert m.link > 1e9 and m.gpu_flops > 1e12  # a PCIe or NVLink GPU's, in bytes and FLOPs
    c = planned.chosen
    assert c is not None and c.step_s is not None, planned.why
    assert "update_then_backward" in c.parts_s and c.step_s == max(c.parts_s.values())
    early = pycxl.fit(shape, "dram0", "gpu0", tokens=2048, update_in_backward=True)
    resident = next(o for o in early.options if o.name == "resident")
    assert "update_then_backward" not in resident.parts_s


@pytest.mark.parametrize("weights", ["resident", "stream"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_fit_says_the_peak_hbm_a_step_allocates(weights: str, checkpointing: bool) -> None:
    """fit's HBM parts (the CUDA context apart) against a step's peak allocated, the
    placement fit describes run as it says: every block's state on the tier, the GPU
    updating them (its buffers taken), the loop people write. Counted from what was
    allocated before the model, and given back once the offload is closed."""
    transformers = pytest.importorskip("transformers")
    from pycxl.torch.offload.fit import Machine, fit

    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                   num_hidden_layers=8, num_attention_heads=8,
                                   num_key_value_heads=8, max_position_embeddings=2048)  # fmt: skip
    warm = torch.ones(64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    (warm @ warm).sum().backward()  # cuBLAS's workspaces, kept by the process, made first
    del warm
    gc.collect()  # what an earlier test left in cycles
    before = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)
    if checkpointing:
        checkpointing_on([model])
    model.train()
    tokens = 2048
    name = weights + (" + checkpointing" if checkpointing else "")
    said = next(o for o in fit(pycxl.TrainShape.of_model(model), Machine("dram0", None, 1 << 40),
                               tokens).options if o.name == name)  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    off = pycxl.offload_model(model, "dram0", "gpu0", optimizer=opt, weights=weights, update="gpu")
    x = torch.randint(0, cfg.vocab_size, (1, tokens), device="cuda")
    for _ in range(2):  # the second step's peak: the update's buffers taken in the first
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        model(input_ids=x, labels=x).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        off.optimizer.step()
        off.optimizer.zero_grad()
    off.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    off.close()
    del model, opt, off, x
    gc.collect()
    left = torch.cuda.memory_allocated() - before
    expected = sum(v for k, v in said.hbm.items() if k not in ("cuda_context", "headroom"))
    parts = {k: round(v / 2**20) for k, v in said.hbm.items()}
    # within 10% at this size (streamed and checkpointed it held 6.5% less, 2.16 GiB, on
    # an H100); at 10.5 B train_largest finds fit within 2.2%
    assert 0.9 < peak / expected < 1.1, f"{name}: peak {peak / 2**20:.0f} MiB, fit's {parts}"
    assert left < 16 * 2**20, f"{left / 2**20:.0f} MiB still allocated after close()"
