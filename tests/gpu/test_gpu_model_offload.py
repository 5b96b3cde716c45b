"""A whole Hugging Face model trained with its blocks' optimizer state (and, streamed,
their weights) on a tier, on the GPU machine: equal to training all in HBM with fp32
masters, with the update on the CPU, on the GPU and split, overlapped with the next
forward pass or not, begun in the backward pass; the habits of a training loop
(accumulation, clipping, a scheduler, activation checkpointing of both kinds,
torch.compile); a save and load that resumes; generate; state on the node; a streamed
model built on the CPU that the GPU never holds whole."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import pycxl
from pycxl.numa.pages import pages_by_node
from pycxl.resolve.system import snapshot
from tests.training import checkpointing_on, train as _train

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
LR = 1e-3


def _llama(layers: int = 4, device: str = "cuda") -> Any:
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
    return transformers.LlamaForCausalLM(cfg).to(device, torch.bfloat16)


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
            m.grad = None if p.grad is None else p.grad.float()  # Adam skips it then
        self.opt.step()
        for m, p in zip(self.masters, self.params, strict=True):
            p.data.copy_(m)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def _offload(model: Any, update: str = "auto", **kwargs: Any) -> Any:
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    return pycxl.offload_model(model, "dram0", "gpu0", optimizer=opt, update=update, **kwargs)


@pytest.mark.parametrize("weights", ["resident", "stream"])
@pytest.mark.parametrize("update", ["cpu", "gpu", "split"])
def test_training_equals_fp32_masters_in_hbm_wherever_the_blocks_are_updated(
    update: str, weights: str
) -> None:
    ref_model = _llama()
    model = copy.deepcopy(ref_model)
    off = _offload(model, "auto" if update == "split" else update, weights=weights)
    if update == "split":
        off.set_plan(gpu=[1, 3])
    _trains_as_in_hbm(ref_model, model, off)
    off.close()


def _trains_as_in_hbm(ref_model: Any, model: Any, off: Any) -> None:
    """Six steps of ``model`` with the offload's optimizer equal those of ``ref_model``
    with fp32 masters in HBM, the loss falling, the state on the tier's node."""
    data = _data(6)
    want = _train(ref_model, _Reference(ref_model), data)
    got = _train(model, off.optimizer, data)
    assert got == pytest.approx(want, abs=2e-2)
    assert got[-1] < got[0]
    for a, b in zip(ref_model.parameters(), model.parameters(), strict=True):
        assert (a.float().cpu() - b.float().cpu()).abs().max().item() < 2e-2
    node = snapshot(gpus=False).resolve("dram0").node
    pages = off.pages_by_node()
    assert set(pages) == {node} and pages[node] > 0


@pytest.mark.parametrize(
    ("weights", "reentrant"), [("resident", None), ("stream", True), ("stream", False)]
)
def test_accumulation_clipping_a_scheduler_and_checkpointing_train_as_in_hbm(
    weights: str, reentrant: bool | None
) -> None:
    ref_model = _llama()
    model = copy.deepcopy(ref_model)
    checkpointing_on([ref_model, model], reentrant)
    off = _offload(model, weights=weights)
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


def _clipped_as_in_hbm(ref_model: Any, model: Any, off: Any) -> None:
    """Six steps clipped at 0.5 with a scheduler: the norms and losses of ``model`` under
    the offload equal those of ``ref_model`` with fp32 masters in HBM, the clip binding
    and the loss falling."""
    ref = _Reference(ref_model)
    data = _data(6)
    want_norms: list[float] = []
    got_norms: list[float] = []
    lambda_lr = torch.optim.lr_scheduler.LambdaLR
    want = _train(ref_model, ref, data, clip=0.5, norms=want_norms,
                  sched=lambda_lr(ref.opt, lambda s: 1 / (1 + s)))  # fmt: skip
    got = _train(model, off.optimizer, data, clip=0.5, norms=got_norms,
                 sched=lambda_lr(off.optimizer, lambda s: 1 / (1 + s)))  # fmt: skip
    assert want_norms[0] > 0.5  # the clip binds
    assert got_norms == pytest.approx(want_norms, rel=2e-2)
    assert got == pytest.approx(want, abs=2e-2)
    assert got[-1] < got[0]


@pytest.mark.parametrize(("weights", "update"), [("resident", "auto"), ("stream", "auto"),
                                               ("stream", "cpu"), ("stream", "gpu")])  # fmt: skip
def test_clipping_each_step_gives_the_norms_and_losses_of_hbm(weights: str, update: str) -> None:
    """A clip every step (streamed: the blocks' norms taken on the GPU as their gradients
    left, the coefficient applied in the update on either side) with a scheduler: the
    norms and the losses are those of fp32 masters in HBM, and the clip binds."""
    ref_model = _llama()
    model = copy.deepcopy(ref_model)
    off = _offload(model, update, weights=weights)
    _clipped_as_in_hbm(ref_model, model, off)
    off.close()


@pytest.mark.parametrize(
    ("weights", "hbm_blocks", "backward"),
    [("resident", 2, False), ("resident", 2, True), ("resident", 4, False),
     ("stream", 2, False), ("stream", 2, True), ("stream", 4, False)],
)  # fmt: skip
def test_blocks_whose_state_is_in_hbm_train_as_in_hbm(
    weights: str, hbm_blocks: int, backward: bool
) -> None:
    """hbm_blocks: the first blocks' state in the GPU's memory, updated there (streamed:
    their weights stay there too, the rest stream); the others split as before. Clipped
    every step with a scheduler (and update_in_backward): the losses and norms of fp32
    masters in HBM; the state where it was put; a save and load that resumes; set_plan
    refuses the HBM blocks."""
    ref_model = _llama()
    # streamed, built on the host as a model larger than HBM is: the HBM blocks move over
    model = copy.deepcopy(ref_model).to("cpu" if weights == "stream" else "cuda")
    off = _offload(model, weights=weights, hbm_blocks=hbm_blocks, update_in_backward=backward)
    if weights == "stream":
        assert model.model.layers[0].mlp.up_proj.weight.is_cuda
        assert model.model.layers[3].mlp.up_proj.weight.is_cuda == (hbm_blocks == 4)
    plan = off.plan()
    assert plan.hbm == tuple(range(hbm_blocks))
    assert sorted(plan.cpu + plan.gpu) == list(range(hbm_blocks, 4))
    _clipped_as_in_hbm(ref_model, model, off)
    data = _data(3)
    first = model.model.layers[0].mlp.up_proj.weight
    last = model.model.layers[3].mlp.up_proj.weight
    assert off.master_weights(first).is_cuda
    assert off.master_weights(last).is_cuda == (hbm_blocks == 4)
    assert (off.pages_by_node() == {}) == (hbm_blocks == 4)
    saved = copy.deepcopy({"model": model.state_dict(), "opt": off.optimizer.state_dict()})
    after = _train(model, off.optimizer, data, clip=0.5)
    if hbm_blocks < 4:
        with pytest.raises(pycxl.InvalidRequestError, match=r"blocks 0.* state in HBM"):
            off.set_plan(gpu=[0])
    off.close()
    fresh = _llama()
    again = _offload(fresh, weights=weights, hbm_blocks=hbm_blocks)
    fresh.load_state_dict(saved["model"])  # the masters follow the weights
    again.optimizer.load_state_dict(saved["opt"])
    assert _train(fresh, again.optimizer, data, clip=0.5) == pytest.approx(after, abs=1e-3)
    again.close()


@pytest.mark.parametrize("weights", ["resident", "stream"])
def test_a_saved_model_and_optimizer_resume_to_the_same_losses(tmp_path: Any, weights: str) -> None:
    model = _llama()
    off = _offload(model, weights=weights)
    data = _data(6)
    _train(model, off.optimizer, data[:3])
    torch.save({"model": model.state_dict(), "opt": off.optimizer.state_dict()}, tmp_path / "ck.pt")
    after = _train(model, off.optimizer, data[3:])
    off.close()
    saved = torch.load(tmp_path / "ck.pt")
    fresh = _llama()
    off2 = _offload(fresh, weights=weights)
    fresh.load_state_dict(saved["model"])  # into the offloaded model: the masters follow
    off2.optimizer.load_state_dict(saved["opt"])
    assert _train(fresh, off2.optimizer, data[3:]) == pytest.approx(after, abs=1e-3)
    off2.close()


@pytest.mark.parametrize(("weights", "hbm_blocks"), [("resident", 1), ("stream", 1)])
def test_a_run_saved_to_a_folder_resumes_bit_for_bit(
    tmp_path: Any, weights: str, hbm_blocks: int
) -> None:
    """offload.save / offload.load: weights on the GPU or at home, state on the tier and
    in HBM, each read back where it lives; the resumed run's losses are the saved run's."""
    model = _llama()
    # the tier's blocks on one side (the split of a run refines itself: a resumed one's
    # would differ, and the two sides' Adam round apart)
    off = _offload(model, "cpu", weights=weights, hbm_blocks=hbm_blocks)
    data = _data(6)
    _train(model, off.optimizer, data[:3], clip=0.5)
    folder = off.save(tmp_path / "run")
    after = _train(model, off.optimizer, data[3:], clip=0.5)
    off.close()
    fresh = _llama()
    for p in fresh.parameters():
        p.data.normal_()  # nothing of these survives the load
    again = _offload(fresh, "cpu", weights=weights, hbm_blocks=hbm_blocks)
    again.load(folder)
    assert _train(fresh, again.optimizer, data[3:], clip=0.5) == after
    again.close()


@pytest.mark.parametrize(("weights", "hbm_blocks"), [("resident", 0), ("stream", 1)])
def test_a_model_built_on_meta_from_its_checkpoint_trains_as_the_one_saved(
    tmp_path: Any, weights: str, hbm_blocks: int
) -> None:
    """Made straight into its placement (the GPU, HBM blocks, homes on the tier) from a
    sharded safetensors checkpoint: the same losses as the model it was saved from."""
    ref = _llama()
    ref.save_pretrained(tmp_path / "ck", max_shard_size="1MB")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(ref.config).to(torch.bfloat16)
    off = _offload(model, weights=weights, hbm_blocks=hbm_blocks, weights_from=tmp_path / "ck")
    assert all(p.device.type == ("cpu" if p.is_pinned() else "cuda") for p in model.parameters())
    data = _data(4)
    got = _train(model, off.optimizer, data, clip=1.0)
    off.close()
    off_ref = _offload(ref, weights=weights, hbm_blocks=hbm_blocks)
    want = _train(ref, off_ref.optimizer, data, clip=1.0)
    assert got == pytest.approx(want, abs=1e-3)  # the split may differ: CPU and GPU Adam
    off_ref.close()


@pytest.mark.parametrize(
    ("weights", "plan"),
    [("resident", "auto"), ("resident", "split"), ("resident", "early"), ("resident", "cpu"),
     ("stream", "auto"), ("stream", "split")],
)  # fmt: skip
def test_an_update_begun_in_the_backward_pass_trains_as_in_hbm(weights: str, plan: str) -> None:
    ref_model = _llama(6)
    model = copy.deepcopy(ref_model)
    checkpointing_on([ref_model, model])  # the blocks run again inside the backward pass
    off = _offload(
        model, "cpu" if plan == "cpu" else "auto", weights=weights, update_in_backward=True
    )
    first = off.plan()
    # the CPU takes the last blocks (their gradients come first), the GPU the first ones
    assert first.in_backward or plan == "cpu"
    assert list(first.gpu + first.cpu) == list(range(6))
    if plan == "split":
        off.set_plan(gpu=[0, 1, 2])
    if plan == "early":  # the GPU side begins blocks 5 and 3 in the backward pass too
        off.set_plan(gpu=[0, 1, 3, 5], gpu_early=[3, 5])
    _trains_as_in_hbm(ref_model, model, off)
    # begun in the backward pass: once it is over (and the update waited for), the CPU's
    # blocks and the GPU's begun there have their new weights, the other GPU's only after
    # step()
    x = _data(1)[0][0]

    def weights() -> list[Any]:
        return [b.mlp.up_proj.weight.detach().float().cpu().clone() for b in model.model.layers]

    before = weights()
    model(input_ids=x, labels=x).loss.backward()
    off.synchronize()
    moved = {
        i for i, (a, b) in enumerate(zip(before, weights(), strict=True)) if not torch.equal(a, b)
    }
    assert moved == set(off.plan().cpu) | set(off.plan().gpu_early)
    off.optimizer.step()
    off.optimizer.zero_grad()
    off.close()


def test_the_plan_names_every_block_once_with_rates_measured_here() -> None:
    off = _offload(_llama(6))
    plan = off.plan()
    assert sorted(plan.cpu + plan.gpu) == list(range(6))
    assert plan.cpu_rate and plan.cpu_rate > 0 and plan.gpu_rate and plan.gpu_rate > 0
    assert "G parameters/s" in str(plan)
    off.close()


@pytest.mark.parametrize("weights", ["resident", "stream"])
def test_an_update_beside_the_next_forward_pass_trains_as_one_that_waits(weights: str) -> None:
    first, second = _llama(), _llama()
    off_a = _offload(first, weights=weights, overlap=True)
    off_b = _offload(second, weights=weights, overlap=False)
    for off in (off_a, off_b):
        off.set_plan(gpu=[1, 3])
    data = _data(5)
    want = _train(second, off_b.optimizer, data)
    assert _train(first, off_a.optimizer, data) == pytest.approx(want, abs=1e-2)
    off_a.close()
    off_b.close()


@pytest.mark.parametrize("weights", ["resident", "stream"])
def test_a_parameter_without_a_gradient_is_not_stepped_on_either_side(weights: str) -> None:
    ref_model = _llama()
    model = copy.deepcopy(ref_model)
    off = _offload(model, weights=weights)
    off.set_plan(gpu=[0, 1])
    ref = _Reference(ref_model)
    x = _data(1)[0][0]
    for m, o in ((ref_model, ref), (model, off.optimizer)):
        m(input_ids=x, labels=x).loss.backward()
        for i in (0, 3):  # one block of each side
            m.model.layers[i].mlp.down_proj.weight.grad = None
        o.step()
        o.zero_grad()
    off.synchronize()
    init = _llama()
    for i in (0, 3):
        got = model.model.layers[i].mlp.down_proj.weight.float().cpu()
        assert torch.equal(got, init.model.layers[i].mlp.down_proj.weight.float().cpu())
    for a, b in zip(ref_model.parameters(), model.parameters(), strict=True):
        assert (a.float().cpu() - b.float().cpu()).abs().max().item() < 2e-2
    off.close()


def _streamed_run(layers: int) -> tuple[int, int, int]:
    """GPU memory a streamed model of ``layers`` blocks (built on the CPU, 103 MB of bf16
    each) takes through set-up, training, a backward pass and generate, all told (the
    driver's ring too), and the peak of PyTorch's live tensors; and one block's bytes.
    The batch is 2 x 16 tokens, so the activations (which grow with the blocks, about
    2 MiB each here) are small beside a block."""
    cfg = transformers.LlamaConfig(
        vocab_size=512, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)  # on the CPU
    block = sum(p.numel() * 2 for p in model.model.layers[0].parameters())
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free_before, _ = torch.cuda.mem_get_info()
    off = _offload(model, weights="stream")
    layer = model.model.layers[1].mlp.up_proj.weight
    node = snapshot(gpus=False).resolve("dram0").node
    assert layer.device.type == "cpu"
    assert set(pages_by_node(layer.detach())) == {node}
    data = [[x[:, :16]] for x in _data(3)[0]] * 3
    losses = _train(model, off.optimizer, data)
    assert losses[-1] < losses[0]
    x = data[0][0]
    model(input_ids=x, labels=x).loss.backward()
    assert layer.grad is not None and layer.grad.device.type == "cpu"
    assert set(pages_by_node(layer.grad)) == {node}
    off.optimizer.zero_grad()
    plain = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    plain.load_state_dict(model.state_dict())
    prompt = x[:1, :8]
    with torch.no_grad():
        tokens = model.generate(prompt, max_new_tokens=8, do_sample=False)
    torch.cuda.synchronize()
    held = free_before - torch.cuda.mem_get_info()[0]
    peak = torch.cuda.max_memory_allocated()
    off.close()
    del model, off
    plain.to("cuda")
    with torch.no_grad():
        assert torch.equal(tokens, plain.generate(prompt, max_new_tokens=8, do_sample=False))
    return held, peak, block


def test_a_streamed_models_gpu_memory_does_not_grow_with_its_blocks() -> None:
    _streamed_run(2)  # CUDA's one-time costs (kernels loaded, workspaces) are paid here
    small, small_peak, block = _streamed_run(4)
    large, large_peak, _ = _streamed_run(16)
    # Twelve more blocks (1.2 GB) live on the tier. On the GPU each adds its activations
    # (about 2 MiB here) and a little more: on an H200, 10 MiB a block of 98 MiB, in the peak and
    # in what the process holds alike (the caching allocator's segments make the latter
    # step by tens of MiB, so a difference of two runs alone is noise). A model the GPU
    # held whole, or whose gradients it kept, would add a block each.
    added = 16 - 4
    assert (large_peak - small_peak) / added < block / 4, (small_peak, large_peak, block)
    assert (large - small) / added < block / 4, (small, large, block)
    print(
        f"GPU memory of a streamed model: 4 blocks {small / 2**20:.0f} MiB (tensors at "
        f"most {small_peak / 2**20:.0f}), 16 blocks {large / 2**20:.0f} MiB (tensors at "
        f"most {large_peak / 2**20:.0f}); a block: {block / 2**20:.0f} MiB"
    )


@pytest.mark.parametrize("weights", ["resident", "stream"])
def test_a_compiled_model_trains_as_the_uncompiled_one(weights: str) -> None:
    first, second = _llama(2), _llama(2)
    off_a = _offload(first, weights=weights)
    off_b = _offload(second, weights=weights)
    compiled = torch.compile(first)
    data = _data(3)
    got = _train(compiled, off_a.optimizer, data)
    assert got == pytest.approx(_train(second, off_b.optimizer, data), abs=2e-2)
    off_a.close()
    off_b.close()
