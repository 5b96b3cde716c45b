"""A whole Hugging Face model trained with its blocks' optimizer state on a tier, on the
GPU machine: equal to training all in HBM with fp32 masters, with the update on the CPU,
on the GPU and split; the habits of a training loop (accumulation, clipping, a
scheduler, activation checkpointing); a save and load that resumes; state on the node."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import pycxl
from pycxl.system import snapshot

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
LR = 1e-3


def _llama(layers: int = 4) -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)


def _data(steps: int, micro: int = 1) -> list[list[Any]]:
    g = torch.Generator().manual_seed(1)
    fixed = [torch.randint(0, 512, (2, 64), generator=g).cuda() for _ in range(micro)]
    return [fixed] * steps  # one batch again and again: the loss must fall


class _Reference:
    """AdamW over fp32 masters in HBM, the bf16 model updated from them."""

    def __init__(self, model: Any) -> None:
        self.params = list(model.parameters())
        self.masters = [p.detach().float().requires_grad_() for p in self.params]
        self.opt = torch.optim.AdamW(self.masters, lr=LR, weight_decay=0.01)
        self.param_groups = self.opt.param_groups

    def step(self) -> None:
        for m, p in zip(self.masters, self.params, strict=True):
            m.grad = p.grad.float()
        self.opt.step()
        for m, p in zip(self.masters, self.params, strict=True):
            p.data.copy_(m)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def _train(
    model: Any, opt: Any, data: list[list[Any]], *, clip: float | None = None, sched: Any = None
) -> list[float]:
    losses = []
    for micro in data:
        total = 0.0
        for x in micro:
            loss = model(input_ids=x, labels=x).loss / len(micro)
            loss.backward()
            total += float(loss.detach())
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        losses.append(total)
    return losses


def _offload(model: Any, update: str = "auto") -> Any:
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    return pycxl.offload_model(model, "dram0", "gpu0", optimizer=opt, update=update)


@pytest.mark.parametrize("update", ["cpu", "gpu", "split"])
def test_training_equals_fp32_masters_in_hbm_wherever_the_blocks_are_updated(update: str) -> None:
    ref_model = _llama()
    model = copy.deepcopy(ref_model)
    off = _offload(model, "auto" if update == "split" else update)
    if update == "split":
        off.set_plan(gpu=[1, 3])
    data = _data(6)
    want = _train(ref_model, _Reference(ref_model), data)
    got = _train(model, off.optimizer, data)
    assert got == pytest.approx(want, abs=2e-2)
    assert got[-1] < got[0]
    for a, b in zip(ref_model.parameters(), model.parameters(), strict=True):
        assert (a.float() - b.float()).abs().max().item() < 2e-2
    node = snapshot(gpus=False).resolve("dram0").node
    pages = off.pages_by_node()
    assert set(pages) == {node} and pages[node] > 0
    off.close()


def test_accumulation_clipping_a_scheduler_and_checkpointing_train_as_in_hbm() -> None:
    ref_model = _llama()
    model = copy.deepcopy(ref_model)
    for m in (ref_model, model):
        m.gradient_checkpointing_enable()
        m.train()
    off = _offload(model)
    ref = _Reference(ref_model)
    data = _data(4, micro=2)
    want = _train(
        ref_model,
        ref,
        data,
        clip=0.5,
        sched=torch.optim.lr_scheduler.LambdaLR(ref.opt, lambda s: 1 / (1 + s)),
    )
    got = _train(
        model,
        off.optimizer,
        data,
        clip=0.5,
        sched=torch.optim.lr_scheduler.LambdaLR(off.optimizer, lambda s: 1 / (1 + s)),
    )
    assert got == pytest.approx(want, abs=2e-2)
    assert off.optimizer.param_groups[0]["lr"] == pytest.approx(LR / 5)
    off.close()


def test_a_saved_model_and_optimizer_resume_to_the_same_losses(tmp_path: Any) -> None:
    model = _llama()
    off = _offload(model)
    data = _data(6)
    _train(model, off.optimizer, data[:3])
    torch.save({"model": model.state_dict(), "opt": off.optimizer.state_dict()}, tmp_path / "ck.pt")
    after = _train(model, off.optimizer, data[3:])
    off.close()
    saved = torch.load(tmp_path / "ck.pt")
    fresh = _llama()
    fresh.load_state_dict(saved["model"])
    off2 = _offload(fresh)
    off2.optimizer.load_state_dict(saved["opt"])
    assert _train(fresh, off2.optimizer, data[3:]) == pytest.approx(after, abs=1e-3)
    off2.close()


def test_the_plan_names_every_block_once_with_rates_measured_here() -> None:
    off = _offload(_llama(6))
    plan = off.plan()
    assert sorted(plan.cpu + plan.gpu) == list(range(6))
    assert plan.cpu_rate and plan.cpu_rate > 0 and plan.gpu_rate and plan.gpu_rate > 0
    assert "G parameters/s" in str(plan)
    off.close()
