"""offload_model without a GPU, on this machine's DRAM node: a tiny Hugging Face Llama
trains equal to plain PyTorch AdamW, its blocks' weights resident or streamed from the
node, with gradient accumulation, clipping, a scheduler and activation checkpointing
(both kinds); its state dicts resume; frozen parameters stay as they are; the fused CPU
step equals torch.optim's; the split of blocks between the sides and its pieces; bad
input refused by name."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError
from pycxl.numa.pages import pages_by_node
from pycxl.resolve.system import snapshot
from pycxl.torch.offload.adam import AdamSettings, CpuAdam
from pycxl.torch.offload.config import OffloadConfig
from pycxl.torch.offload.layout import chunks_of, find_blocks, layout_blocks
from pycxl.torch.offload.update_split import (
    StepTimes,
    refined,
    schedule_in_backward,
    split,
    split_blocks,
    split_from_the_end,
)
from tests.training import checkpointing_on, train as _train

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
LR = 1e-3


def _llama(layers: int = 3) -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(cfg)


def _data(steps: int, micro: int = 1) -> list[list[Any]]:
    g = torch.Generator().manual_seed(1)
    return [
        [torch.randint(0, 256, (2, 32), generator=g) for _ in range(micro)] for _ in range(steps)
    ]


def _adamw(model: Any) -> Any:
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)


def _pair(layers: int = 3, weights: str = "resident") -> tuple[Any, Any, Any]:
    ref = _llama(layers)
    model = copy.deepcopy(ref)
    off = pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), weights=weights)
    return ref, model, off


def test_a_llama_trains_equal_to_plain_adamw_with_its_state_on_the_node() -> None:
    ref, model, off = _pair()
    data = _data(5)
    want = _train(ref, _adamw(ref), data)
    got = _train(model, off.optimizer, data)
    assert got == pytest.approx(want, abs=1e-4)
    assert got[-1] < got[0]
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-4)  # Adam magnifies rounding where |g| ~ eps
    node = snapshot(gpus=False).resolve("dram0").node
    pages = off.pages_by_node()
    assert set(pages) == {node} and pages[node] >= 3  # each block's state at least a page
    assert off.plan().cpu == (0, 1, 2) and off.plan().gpu == ()
    off.close()


@pytest.mark.parametrize(
    ("weights", "reentrant"), [("resident", None), ("stream", True), ("stream", False)]
)
def test_accumulation_clipping_a_scheduler_and_checkpointing_train_as_plain_pytorch(
    weights: str, reentrant: bool | None
) -> None:
    ref, model, off = _pair(weights=weights)
    checkpointing_on([ref, model], reentrant)
    opt = _adamw(ref)
    data = _data(4, micro=2)
    want = _train(
        ref, opt, data, clip=0.5, sched=torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    )
    got = _train(
        model,
        off.optimizer,
        data,
        clip=0.5,
        sched=torch.optim.lr_scheduler.StepLR(off.optimizer, 1, gamma=0.5),
    )
    assert got == pytest.approx(want, abs=1e-4)
    assert off.optimizer.param_groups[0]["lr"] == pytest.approx(LR / 16)
    off.close()


@pytest.mark.parametrize("checkpointing", [False, True])
def test_clipping_streamed_blocks_trains_as_plain_pytorch_from_norms_taken_as_they_left(
    checkpointing: bool,
) -> None:
    """One micro-batch a step, every step clipped: the norms are those plain PyTorch
    finds, and the losses its losses, with a scheduler."""
    ref, model, off = _pair(weights="stream")
    if checkpointing:
        checkpointing_on([ref, model])
    opt = _adamw(ref)
    data = _data(4)
    want_norms: list[float] = []
    got_norms: list[float] = []
    want = _train(ref, opt, data, clip=0.05, norms=want_norms,
                  sched=torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5))  # fmt: skip
    got = _train(model, off.optimizer, data, clip=0.05, norms=got_norms,
                 sched=torch.optim.lr_scheduler.StepLR(off.optimizer, 1, gamma=0.5))  # fmt: skip
    assert min(want_norms) > 0.05  # each step clipped
    assert got_norms == pytest.approx(want_norms, rel=1e-5)
    assert got == pytest.approx(want, abs=1e-4)
    off.close()
    assert torch.nn.utils.clip_grad_norm_ is torch.nn.utils.clip_grad.clip_grad_norm_
    assert torch.nn.utils.clip_grad_norm_.__module__ == "torch.nn.utils.clip_grad"  # put back


@pytest.mark.parametrize("micro", [1, 3])
def test_a_clip_of_streamed_blocks_writes_no_gradient_and_scales_them_in_the_update(
    micro: int,
) -> None:
    """One micro-batch or several: the norms are known when the backward pass ends,
    taken on the way home (a sum's by the CPU threads that add it), so the clip reads
    no gradient and writes none."""
    ref, model, off = _pair(weights="stream")
    for x in _data(1, micro=micro)[0]:
        for m in (ref, model):
            m(input_ids=x, labels=x).loss.backward()
    in_blocks = list(model.model.layers.parameters())
    assert all(off._clip.norm_of(p) is not None for p in in_blocks)
    before = [(p.grad.clone(), p.grad._version) for p in in_blocks]
    for _ in range(2):  # a second clip reads the first's coefficient, as in place
        want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        got = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        assert float(got) == pytest.approx(float(want), rel=1e-5)
    # a list that names a parameter twice counts it twice, as PyTorch does (no clip binds)
    grads = {name: p.grad.clone() for name, p in ref.named_parameters()}
    block_grads = {n: g for n, g in grads.items() if ".layers." in n}
    top = max(block_grads, key=lambda n: float(block_grads[n].norm()))  # counts most
    want = torch.nn.utils.get_total_norm([*grads.values(), grads[top]])
    got = torch.nn.utils.clip_grad_norm_([*model.parameters(), model.get_parameter(top)], 1e9)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    for p, (g, version) in zip(in_blocks, before, strict=True):
        assert p.grad._version == version and torch.equal(p.grad, g)  # not read, not written
    _adamw_ref = _adamw(ref)
    _adamw_ref.step()
    off.optimizer.step()
    off.synchronize()
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    off.optimizer.zero_grad()
    model(input_ids=x, labels=x).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    in_blocks[0].grad.add_(1.0)  # changed after the clip: its update could not be PyTorch's
    with pytest.raises(InvalidRequestError, match="changed after clip_grad_norm_"):
        off.optimizer.step()
    off.close()


def test_a_gradient_changed_before_the_clip_is_read_for_its_norm_and_scaled_in_the_update() -> None:
    """Unscaled in place between the backward pass and the clip (GradScaler's way): the
    norm taken then is stale, so the clip takes it as PyTorch does, and still leaves the
    coefficient to the update."""
    ref, model, off = _pair(weights="stream")
    x = _data(1)[0][0]
    for m in (ref, model):
        m(input_ids=x, labels=x).loss.backward()
        with torch.no_grad():
            for p in m.parameters():
                p.grad.mul_(0.5)
    in_blocks = list(model.model.layers.parameters())
    assert all(off._clip.norm_of(p) is None for p in in_blocks)
    versions = [p.grad._version for p in in_blocks]
    want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
    got = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    assert [p.grad._version for p in in_blocks] == versions  # read, not written
    _adamw(ref).step()
    off.optimizer.step()
    off.synchronize()
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    off.close()


def test_an_update_begun_in_the_backward_pass_refuses_a_clip_the_last_step_had_not() -> None:
    model = _llama()
    off = pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), weights="stream",
                              update_in_backward=True)  # fmt: skip
    assert not off.update_begins_in_backward  # the first step shows the loop
    _train(model, off.optimizer, _data(1))  # one without a clip: the next begins early
    assert off.update_begins_in_backward
    x = _data(1)[0][0]
    model(input_ids=x, labels=x).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    with pytest.raises(InvalidRequestError, match=r"clip_grad_norm_ between .* blocks 0-2"):
        off.optimizer.step()
    off.optimizer.zero_grad()
    assert not off.update_begins_in_backward  # refused: the next step shows it again
    off.close()


@pytest.mark.parametrize("weights", ["resident", "stream"])
@pytest.mark.parametrize(("micro", "clip"), [(1, 0.05), (2, None), (2, 0.05)])
def test_an_update_in_the_backward_pass_learns_a_loop_that_clips_or_accumulates(
    weights: str, micro: int, clip: float | None
) -> None:
    """update_in_backward with the loop's habits on: a clip every step (the update waits
    for step(), which gives it the clipped gradients), accumulation over micro-batches
    (it begins in the last one's backward pass, resident): plain PyTorch's losses, norms
    and weights, and no refusal."""
    ref = _llama()
    model = copy.deepcopy(ref)
    off = pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), weights=weights,
                              update_in_backward=True)  # fmt: skip
    data = _data(4, micro=micro)
    ref_opt = _adamw(ref)
    want_norms: list[float] = []
    got_norms: list[float] = []
    want = _train(ref, ref_opt, data, clip=clip, norms=want_norms,
                  sched=torch.optim.lr_scheduler.StepLR(ref_opt, 1, gamma=0.5))  # fmt: skip
    got = _train(model, off.optimizer, data, clip=clip, norms=got_norms,
                 sched=torch.optim.lr_scheduler.StepLR(off.optimizer, 1, gamma=0.5))  # fmt: skip
    assert got == pytest.approx(want, abs=1e-4)
    assert got_norms == pytest.approx(want_norms, rel=1e-4)
    assert not clip or want_norms[0] > clip  # the clip binds
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-4)
    # streamed, the last micro-batch's gradients are added to the others' on the tier by
    # a thread of their own: the update waits for step() there
    early = clip is None and (weights == "resident" or micro == 1)
    assert off.update_begins_in_backward == early
    if early:  # the blocks' weights move in the last backward pass, the rest at step()
        block = model.model.layers[1].mlp.up_proj.weight
        embed = model.model.embed_tokens.weight
        before = block.detach().clone(), embed.detach().clone()
        for k, x in enumerate(data[0]):
            model(input_ids=x, labels=x).loss.backward()
            assert torch.equal(block, before[0]) == (k < micro - 1)
        assert torch.equal(embed, before[1])
        off.optimizer.step()
        assert not torch.equal(embed, before[1])
    off.close()


@pytest.mark.parametrize(
    ("weights", "checkpointing"),
    [("resident", False), ("resident", True), ("stream", False), ("stream", True)],
)
def test_an_update_begun_in_the_backward_pass_trains_as_plain_pytorch(
    weights: str, checkpointing: bool
) -> None:
    ref = _llama()
    model = copy.deepcopy(ref)
    off = pycxl.offload_model(
        model, "dram0", None, optimizer=_adamw(model), weights=weights, update_in_backward=True
    )
    if checkpointing:
        checkpointing_on([ref, model])
    data = _data(4)
    sched = torch.optim.lr_scheduler.StepLR(off.optimizer, 1, gamma=0.5)
    ref_opt = _adamw(ref)
    want = _train(ref, ref_opt, data, sched=torch.optim.lr_scheduler.StepLR(ref_opt, 1, gamma=0.5))
    got = _train(model, off.optimizer, data, sched=sched)
    assert got == pytest.approx(want, abs=1e-4)
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-4)
    # what the plan reads (the last step's times wait for the next step's beginning): the
    # update began in the backward pass, and the CPU side ran inside it, none after step()
    t = off.times
    assert t.steps == 3 and t.head_s > 0 and t.cpu_s > 0 and not t.gpu_s
    assert t.history[-1] == (0.0, 0.0)
    # begun in the backward pass, not at step(): the blocks have their new weights as
    # soon as it ends, the rest of the model (the embeddings) not before step()
    block = model.model.layers[1].mlp.up_proj.weight
    embed = model.model.embed_tokens.weight
    before = block.detach().clone(), embed.detach().clone()
    x = data[0][0]
    model(input_ids=x, labels=x).loss.backward()
    assert not torch.equal(block, before[0]) and torch.equal(embed, before[1])
    off.optimizer.step()
    assert not torch.equal(embed, before[1])
    off.close()


def _out_of_memory(grad: Any) -> None:
    raise RuntimeError("CUDA out of memory (raised by the test)")


@pytest.mark.parametrize("weights", ["resident", "stream"])
def test_an_update_begun_in_the_backward_pass_refuses_what_needs_the_gradients_later(
    weights: str,
) -> None:
    x = _data(1)[0][0]
    for habit in ("accumulation", "clipping", "a learning rate", "no step", "an error"):
        model = _llama()
        off = pycxl.offload_model(
            model, "dram0", None, optimizer=_adamw(model), weights=weights,
            update_in_backward=True,
        )  # fmt: skip
        _train(model, off.optimizer, _data(1))  # the loop shown: the next step begins early
        if habit == "an error":  # raised inside the backward pass, half-way through a block
            hit = model.model.layers[1].mlp.gate_proj.weight.register_hook(_out_of_memory)
            with pytest.raises(RuntimeError, match="out of memory"):
                model(input_ids=x, labels=x).loss.backward()
            hit.remove()
        else:
            model(input_ids=x, labels=x).loss.backward()
        if habit == "accumulation":  # a second micro-batch before step()
            with pytest.raises(InvalidRequestError, match="accumulation"):
                model(input_ids=x, labels=x).loss.backward()
        elif habit == "clipping":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
            with pytest.raises(InvalidRequestError, match="clipping"):
                off.optimizer.step()
        elif habit == "a learning rate":  # set by hand between backward and step()
            off.optimizer.param_groups[0]["lr"] = 0.0
            with pytest.raises(InvalidRequestError, match="learning rate"):
                off.optimizer.step()
            off.optimizer.param_groups[0]["lr"] = LR
        else:  # a step skipped (GradScaler's, on inf), or a pass that raised, then cleared
            with pytest.raises(InvalidRequestError, match=r"no optimizer\.step"):
                off.optimizer.zero_grad()
        # refused, the loop goes on, and its next steps are whole ones: every parameter
        # of every block stepped and moved, the rest of the model too
        off.optimizer.zero_grad()
        steps = off._adam_steps.by_id()
        before = [p.detach().clone() for p in model.parameters()]
        losses = _train(model, off.optimizer, _data(2))
        # the refused step's times are not planned from: the first step's and the first
        # whole one's after it are in
        assert off.times.steps == 2
        after = off._adam_steps.by_id()
        assert all(after[id(p.param)] == steps[id(p.param)] + 2
                   for B in off._blocks for p in B.params)  # fmt: skip
        assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        assert all(math.isfinite(v) for v in losses)
        off.close()
    streamed = _llama()
    with pytest.raises(InvalidRequestError, match="True or False"):
        pycxl.offload_model(streamed, "dram0", None, optimizer=_adamw(streamed),
                            update_in_backward="yes")  # fmt: skip


def test_param_groups_keep_their_own_settings() -> None:
    ref = _llama()
    model = copy.deepcopy(ref)

    def groups(m: Any) -> list[dict[str, Any]]:
        decay = [p for n, p in m.named_parameters() if p.ndim > 1]
        flat = [p for n, p in m.named_parameters() if p.ndim <= 1]
        return [{"params": decay, "weight_decay": 0.1}, {"params": flat, "weight_decay": 0.0}]

    off = pycxl.offload_model(
        model, "dram0", None, optimizer=torch.optim.AdamW(groups(model), lr=LR)
    )
    data = _data(3)
    want = _train(ref, torch.optim.AdamW(groups(ref), lr=LR), data)
    assert _train(model, off.optimizer, data) == pytest.approx(want, abs=1e-4)
    off.close()


@pytest.mark.parametrize("weights", ["resident", "stream"])
def test_a_saved_model_and_optimizer_resume_to_the_same_losses(tmp_path: Any, weights: str) -> None:
    _, model, off = _pair(weights=weights)
    data = _data(6)
    _train(model, off.optimizer, data[:3])
    torch.save({"model": model.state_dict(), "opt": off.optimizer.state_dict()}, tmp_path / "c.pt")
    after = _train(model, off.optimizer, data[3:])
    off.close()
    saved = torch.load(tmp_path / "c.pt")
    fresh = _llama()
    off2 = pycxl.offload_model(fresh, "dram0", None, optimizer=_adamw(fresh), weights=weights)
    fresh.load_state_dict(saved["model"])  # into the offloaded model: the masters follow
    off2.optimizer.load_state_dict(saved["opt"])
    assert _train(fresh, off2.optimizer, data[3:]) == pytest.approx(after, abs=1e-5)
    bad = saved["opt"]
    del bad["state"][0]["master"]
    with pytest.raises(InvalidRequestError, match="no master and moments"):
        off2.optimizer.load_state_dict(bad)
    off2.close()


@pytest.mark.parametrize("grad_dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("decoupled", [False, True])
def test_the_fused_cpu_step_equals_torch_adam(grad_dtype: str, decoupled: bool) -> None:
    torch.manual_seed(0)
    n = 70_001  # not a multiple of a chunk or a vector
    dtype = getattr(torch, grad_dtype)
    p = torch.randn(n)
    ref = p.clone().requires_grad_()
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = cls([ref], lr=1e-2, weight_decay=0.1)
    state = (p.clone(), torch.zeros(n), torch.zeros(n))
    weight = torch.empty(n, dtype=dtype)
    settings = AdamSettings.of(opt, opt.param_groups[0])
    adam = CpuAdam([0])
    for step in range(1, 4):
        g = (torch.randn(n) * step).to(dtype)
        ref.grad = g.float()
        opt.step()
        adam.step(state, g, None if dtype == torch.float32 else weight, step, settings)
        assert torch.allclose(state[0], ref.detach(), atol=2e-6)
        assert torch.allclose(state[1], opt.state[ref]["exp_avg"], atol=2e-6)
        # Adam's L2 term cancels against the gradient: rounding shows relative to the scale
        assert torch.allclose(state[2], opt.state[ref]["exp_avg_sq"], rtol=1e-4, atol=1e-5)
    if dtype != torch.float32:
        assert torch.equal(weight, state[0].to(dtype))  # the master, rounded as PyTorch rounds
    adam.close()


@pytest.mark.parametrize("decoupled", [False, True])
def test_the_rest_is_updated_in_pieces_as_torch_adam_updates_it(
    monkeypatch: pytest.MonkeyPatch, decoupled: bool
) -> None:
    """The embedding's and head's update cut into batches of at most a chunk, so that
    their fp32 gradient copies are a batch's, by the real fused Adam (PyTorch's own on
    the CPU here): what torch's Adam/AdamW gives, bf16 and fp32 parameters, a strided
    one (updated whole) and a gradient laid out unlike its parameter."""
    from pycxl.torch.offload import rest
    from pycxl.torch.offload.adam import AdamSteps

    monkeypatch.setattr(rest, "CHUNK_ELEMENTS", 8)
    torch.manual_seed(0)
    params = [torch.randn(s).to(torch.bfloat16) for s in [(5, 2), (25,), (3,), (6, 4), (4, 6)]]
    params[3] = params[3].t()  # strided: updated as it lies
    params[4] = params[4].float()  # fp32: the master is the parameter
    for p in params:
        p.grad = torch.randn(p.shape).to(p.dtype)
    params[0].grad = torch.randn(2, 5).to(torch.bfloat16).t()  # laid out unlike its param
    params[3].grad = params[3].grad.contiguous()
    update = rest.RestUpdate(params, dict.fromkeys(map(id, params), 0), torch.device("cpu"),
                             AdamSteps())  # fmt: skip
    batches = list(rest._pieces(update.entries))
    sizes = [sum(g.numel() for _, g, *_ in b) for b in batches]
    assert sizes == [8, 2, 8, 8, 8, 4, 24, 8, 8, 8] and sum(sizes) == sum(p.numel() for p in params)
    references = [m.clone().requires_grad_() for _, m, _, _ in update.entries]
    for r, p in zip(references, params, strict=True):
        r.grad = p.grad.float()
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    torch_adam = cls(references, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    settings = AdamSettings.of(torch_adam, torch_adam.param_groups[0])
    for _ in range(2):
        update.steps.advance(params)
        update.fused_step(update.entries, [settings])
        torch_adam.step()
    for (p, master, a, v), r in zip(update.entries, references, strict=True):
        torch.testing.assert_close(master, r.detach())
        torch.testing.assert_close(a, torch_adam.state[r]["exp_avg"])
        torch.testing.assert_close(v, torch_adam.state[r]["exp_avg_sq"])
        assert torch.equal(p, master.to(p.dtype))  # the weight set from its master


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_cpu_adds_gradients_as_pytorch_rounds_and_gives_the_sums_norm(dtype: str) -> None:
    """A later micro-batch's gradients added home by the update's threads: the sum is
    ``add_``'s to the bit, and the squared norm the one torch finds for it."""
    dt = getattr(torch, dtype)
    torch.manual_seed(1)
    n = 100_003  # not a multiple of any lane count or chunk
    home, incoming = torch.randn(n).to(dt), (torch.randn(n) * 3).to(dt)
    want = home.clone().add_(incoming)
    adam = CpuAdam([0])
    sumsq = adam.accumulate(home, incoming, add=True)
    assert torch.equal(home, want)
    assert sumsq == pytest.approx(float(want.double().square().sum()), rel=1e-6)
    home.fill_(float("nan"))  # a copy reads nothing of what was there
    assert adam.accumulate(home, incoming, add=False) == pytest.approx(
        float(incoming.double().square().sum()), rel=1e-6
    )
    assert torch.equal(home, incoming)
    with pytest.raises(InvalidRequestError, match="must match"):
        adam.accumulate(home[:-1], incoming, add=True)
    adam.close()


def test_the_split_puts_each_block_where_it_finishes_first() -> None:
    sizes = {i: 100 for i in range(8)}
    cpu, gpu = split(sizes, cpu_rate=100.0, gpu_rate=300.0)
    assert sorted(cpu + gpu) == list(range(8)) and len(cpu) == 2 and len(gpu) == 6
    assert split(sizes, 1.0, 1.0) == ([0, 2, 4, 6], [1, 3, 5, 7])


def test_begun_in_the_backward_pass_the_cpu_takes_the_last_blocks_and_its_head_start() -> None:
    sizes = {i: 100 for i in range(8)}
    cpu, gpu, after = split_from_the_end(sizes, cpu_rate=100.0, gpu_rate=100.0, head_s=0.0)
    assert (cpu, gpu, after) == ([4, 5, 6, 7], [0, 1, 2, 3], pytest.approx(4.0))
    # two seconds ahead, the CPU takes one block more and both are done a second sooner
    cpu, gpu, after = split_from_the_end(sizes, 100.0, 100.0, head_s=2.0)
    assert (cpu, gpu, after) == ([3, 4, 5, 6, 7], [0, 1, 2], pytest.approx(3.0))
    plan = split_blocks(sizes, 100.0, 100.0, "set-up", head_s=0.0)
    assert plan.in_backward and "after step()" in str(plan)
    times = StepTimes()
    # the CPU worked 6 s, 2 of them before step(), and ended when the GPU did: it stays
    times.add(cpu_s=6.0, gpu_s=4.0, head_s=2.0, cpu_after_s=4.0)
    kept = refined(plan, sizes, times, gpu_begins=False)  # streamed: the GPU waits for step()
    assert kept is not None and (kept.cpu, kept.gpu) == (plan.cpu, plan.gpu)
    times.add(cpu_s=4.0, gpu_s=4.0, head_s=2.0, cpu_after_s=2.0)  # done 2 s early: takes more
    new = refined(plan, sizes, times, gpu_begins=False)
    assert new is not None and new.in_backward and len(new.cpu) > len(plan.cpu)
    assert not new.gpu_early


def test_once_a_step_showed_the_backward_pass_the_gpu_side_begins_blocks_in_it_too() -> None:
    sizes = {i: 100 for i in range(4)}
    # gradients at 0, 1, 2 and 3 s (block 3 first), step() at 3 s, a block a second a side:
    # the CPU takes block 3, the GPU block 2 as it arrives, then whoever waited longer
    assert schedule_in_backward(sizes, 100.0, 100.0, 3.0) == ([1, 3], [0, 2], [2], 1.0)
    # no backward pass to begin in: the plan of step() (each block to who finishes it first)
    for rates in ((100.0, 100.0), (100.0, 300.0), (250.0, 100.0)):  # no ties in between
        assert schedule_in_backward(sizes, *rates, 0.0)[:2] == split(sizes, *rates)
    # a backward pass far longer than the update: all is done before step() but the first
    # block, whose gradients come last
    cpu, gpu, early, after = schedule_in_backward(sizes, 100.0, 100.0, 20.0)
    assert after == pytest.approx(1.0) and sorted(cpu + gpu) == [0, 1, 2, 3]
    assert set(early) == set(gpu) - {0}
    # the first block's gradients come at step() exactly, whatever the rounding of the rest
    for backward_s in (0.1, 0.3, 0.4224, 1 / 3, 0.7):
        cpu, gpu, early, after = schedule_in_backward(sizes, 1000.0, 1500.0, backward_s)
        assert 0 not in early
    # the rates a step showed, 16 blocks: the GPU side begins some in the backward pass
    # and the update after step() is shorter than with the CPU's head start alone
    sizes = {i: 51_400_000 for i in range(16)}
    cpu, gpu, early, after = schedule_in_backward(sizes, 2.01e9, 3.0e9, 0.037)
    assert early and set(early) <= set(gpu) and early == sorted(early, reverse=True)
    assert after < 0.95 * split_from_the_end(sizes, 2.01e9, 3.0e9, 0.037)[2]


def test_a_step_that_shows_the_backward_pass_moves_the_plan_where_it_finishes_sooner() -> None:
    sizes = {i: 100 for i in range(8)}
    plan = split_blocks(sizes, 100.0, 100.0, "set-up", head_s=0.0)  # no step seen: from the end
    assert not plan.gpu_early
    times = StepTimes()
    # the sides ended together after step(), the CPU 2 s into the backward pass before it
    times.add(cpu_s=6.0, gpu_s=4.0, head_s=2.0, cpu_after_s=4.0)
    new = refined(plan, sizes, times)
    assert new is not None and new.seen and new.gpu_early and "begun in backward" in str(new)
    assert new.predicted_s is not None and new.predicted_s < 0.9 * 4.0
    # the GPU side's time after step() is what is weighed against the CPU's
    times.add(cpu_s=6.0, gpu_s=5.0, head_s=2.0, gpu_after_s=4.0, cpu_after_s=4.0)
    assert refined(new, sizes, times) is None  # balanced, seen, and nothing sooner
    assert times.history[-1] == (4.0, 4.0)  # what a user reads: each side's time after step()


def test_a_plan_that_gave_one_side_every_block_is_looked_at_again() -> None:
    sizes = {i: 100 for i in range(8)}
    # set-up showed the GPU side far faster: it took every block
    plan = split_blocks(sizes, 100.0, 1000.0, "set-up")
    assert not plan.cpu
    times = StepTimes()
    times.add(cpu_s=0.0, gpu_s=4.0)  # with both sides' traffic it was far slower than alone
    new = refined(plan, sizes, times)
    assert new is not None and new.cpu  # the CPU at set-up's rate takes some
    assert not new.seen  # its rate was not one seen in a step: the next step refines it
    assert new.gpu_rate == pytest.approx(200.0) and new.cpu_rate == plan.cpu_rate
    times.add(cpu_s=2.0, gpu_s=2.1)  # both sides ran, and ended together: both rates seen
    again = refined(new, sizes, times)
    assert again is not None and again.seen and (again.cpu, again.gpu) == (new.cpu, new.gpu)


def test_the_blocks_of_a_model_are_its_largest_list_of_one_kind() -> None:
    model = _llama()
    assert find_blocks(model) == list(model.model.layers)
    with pytest.raises(InvalidRequestError, match="no list of repeated blocks"):
        find_blocks(torch.nn.Linear(4, 4))


def test_optimizers_and_settings_it_cannot_hold_are_refused_before_anything_is_placed() -> None:
    model = _llama()
    with pytest.raises(InvalidRequestError, match="Adam and AdamW"):
        pycxl.offload_model(
            model, "dram0", None, optimizer=torch.optim.SGD(model.parameters(), lr=1)
        )
    with pytest.raises(InvalidRequestError, match="amsgrad"):
        pycxl.offload_model(
            model, "dram0", None, optimizer=torch.optim.AdamW(model.parameters(), amsgrad=True)
        )
    some = list(model.parameters())[:3]
    with pytest.raises(InvalidRequestError, match="does not update"):
        pycxl.offload_model(model, "dram0", None, optimizer=torch.optim.AdamW(some))
    with pytest.raises(InvalidRequestError, match="update 'fast'"):
        pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), update="fast")
    with pytest.raises(InvalidRequestError, match="needs a GPU"):
        pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), update="gpu")
    off = pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model))
    with pytest.raises(InvalidRequestError, match="no GPU"):
        off.set_plan(gpu=[0])
    with pytest.raises(InvalidRequestError, match=r"blocks \[7\]"):
        off.set_plan(gpu=[7])
    with pytest.raises(InvalidRequestError, match="needs update_in_backward=True"):
        off.set_plan(gpu=[], gpu_early=[1])
    off.close()
    off = pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model),
                              update_in_backward=True)  # fmt: skip
    with pytest.raises(InvalidRequestError, match="gpu_early blocks 1 are not among"):
        off.set_plan(gpu=[], gpu_early=[1])
    off.close()


def test_a_model_whose_state_the_tier_cannot_hold_is_refused_before_any_is_taken() -> None:
    """Built on the meta device (nothing of it exists): 8 blocks of 64 Ki x 64 Ki weights
    (34 G parameters, 400 GiB of fp32 state) on a host of far less; the answer is fit's,
    given before the optimizer or the memory is looked at."""
    with torch.device("meta"):
        model = torch.nn.Sequential(*(torch.nn.Linear(1 << 16, 1 << 16) for _ in range(8)))
    node = snapshot(gpus=False).resolve("dram0").node
    free = sum(t.node.mem_available for t in snapshot(gpus=False).nodes if t.node.id == node)
    assert free < 12 * (8 << 32), "a host of 400 GiB free: this model would fit"
    with pytest.raises(InvalidRequestError, match=r"GiB more free memory on dram0.*plan-train"):
        pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), weights="stream",
                            blocks=list(model))  # fmt: skip


def test_streamed_blocks_live_on_the_node_and_visit_the_ring_only_while_they_run() -> None:
    ref, model, off = _pair(weights="stream")
    data = _data(4, micro=2)
    want = _train(ref, _adamw(ref), data)
    assert _train(model, off.optimizer, data) == pytest.approx(want, abs=1e-5)
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-4)  # the fused step rounds as the for-loop Adam
    layer = model.model.layers[1].mlp.up_proj.weight
    node = snapshot(gpus=False).resolve("dram0").node
    home = {n for n in pages_by_node(layer.detach())}
    assert home == {node}  # between passes a block's parameter is its memory on the tier
    stats = off.ferry.ring.stats
    assert stats.copies_in + stats.reused == 2 * 3 * 8  # each block: a forward, a backward
    x = data[0][0]
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    grad = layer.grad
    assert grad is not None and grad.device.type == "cpu"
    assert set(pages_by_node(grad)) == {node}  # the gradient came home
    off.optimizer.zero_grad()
    pages = off.pages_by_node()
    assert set(pages) == {node} and pages[node] >= 3 * 3  # state, weights, gradients
    off.close()


def test_frozen_parameters_stream_and_stay_as_they_are() -> None:
    ref = _llama()
    model = copy.deepcopy(ref)
    for m in (ref, model):
        for layer in m.model.layers:
            layer.self_attn.requires_grad_(False)  # adapters' way: part of each block frozen
    before = model.model.layers[0].self_attn.q_proj.weight.detach().clone()

    def adamw(m: Any) -> Any:
        return torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=LR)

    off = pycxl.offload_model(model, "dram0", None, optimizer=adamw(model), weights="stream")
    data = _data(3)
    want = _train(ref, adamw(ref), data)
    assert _train(model, off.optimizer, data) == pytest.approx(want, abs=1e-5)
    assert torch.equal(model.model.layers[0].self_attn.q_proj.weight, before)
    off.close()


@pytest.mark.parametrize("weights", ["resident", "stream"])
def test_a_parameter_without_a_gradient_is_not_stepped(weights: str) -> None:
    ref, model, off = _pair(weights=weights)
    opt = _adamw(ref)
    x = _data(1)[0][0]
    for m, o in ((ref, opt), (model, off.optimizer)):
        m(input_ids=x, labels=x).loss.backward()
        m.model.layers[1].mlp.down_proj.weight.grad = None  # as Adam skips it, so must we
        o.step()
        o.zero_grad()
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert torch.equal(
        ref.model.layers[1].mlp.down_proj.weight, model.model.layers[1].mlp.down_proj.weight
    )
    off.close()


@pytest.mark.parametrize("weights", ["resident", "stream"])
def test_weights_loaded_into_the_model_become_the_masters(weights: str) -> None:
    ref, model, off = _pair(weights=weights)
    other = _llama()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    model.load_state_dict(other.state_dict())
    ref.load_state_dict(other.state_dict())
    data = _data(2)
    assert _train(model, off.optimizer, data) == pytest.approx(
        _train(ref, _adamw(ref), data), abs=1e-5
    )
    off.close()


def test_a_streamed_model_generates_the_tokens_of_the_plain_one() -> None:
    _, model, off = _pair(weights="stream")
    _train(model, off.optimizer, _data(2))
    plain = _llama()
    plain.load_state_dict(model.state_dict())
    prompt = _data(1)[0][0][:1, :8]
    kwargs = {"max_new_tokens": 6, "do_sample": False}
    with torch.no_grad():
        assert torch.equal(model.generate(prompt, **kwargs), plain.generate(prompt, **kwargs))
    off.close()


def test_the_gpu_side_takes_blocks_in_pieces_of_one_group() -> None:
    model = _llama(2)
    decay = [p for p in model.parameters() if p.ndim > 1]
    flat = [p for p in model.parameters() if p.ndim <= 1]
    group_of = {id(p): 0 for p in decay} | {id(p): 1 for p in flat}
    (B, _) = layout_blocks(list(model.model.layers), group_of, with_frozen=False)
    pieces = chunks_of(B, 5000, B.params, key=lambda p: p.group)
    assert all(b - a <= 5000 for a, b, _ in pieces)
    for p in B.params:  # every element of every parameter in exactly one piece of its group
        covered = sum(
            min(b, p.offset + p.numel) - max(a, p.offset)
            for a, b, g in pieces
            if g == p.group and a < p.offset + p.numel and b > p.offset
        )
        assert covered == p.numel
    some = B.params[:2]
    assert max(b for _, b, _ in chunks_of(B, 5000, some, key=lambda p: p.group)) <= (
        some[1].offset + some[1].numel + 63
    )
    steps = {id(B.params[1].param): 7}  # a parameter that skipped steps is a piece of its own
    pieces = chunks_of(B, 1 << 30, B.params, key=lambda p: (p.group, steps.get(id(p.param), 0)))
    keys = {k for _, _, k in pieces}
    assert (B.params[1].group, 7) in keys and len(keys) >= 3


def test_the_split_is_refined_from_the_step_times_only_while_the_sides_differ() -> None:
    sizes = {i: 100 for i in range(8)}
    plan = split_blocks(sizes, 100.0, 100.0, "set-up")
    assert plan.predicted_s == pytest.approx(4.0)
    times = StepTimes()
    times.add(cpu_s=4.4, gpu_s=4.6)
    kept = refined(plan, sizes, times)  # within 10%: the split stays, the rates are seen
    assert kept is not None and (kept.cpu, kept.gpu) == (plan.cpu, plan.gpu)
    assert kept.predicted_s == pytest.approx(4.6) and kept.seen and not plan.seen
    assert refined(kept, sizes, times) is None
    times.add(cpu_s=8.0, gpu_s=4.0)
    new = refined(plan, sizes, times)
    assert new is not None and len(new.gpu) > len(new.cpu) and "step 2" in new.why
    assert new.seen  # a new split: its rates are the ones seen
    for _ in range(3):
        times.add(cpu_s=8.0, gpu_s=4.0)
    assert refined(plan, sizes, times) is None  # after the first steps the split stays


def test_stream_settings_are_checked_where_they_enter() -> None:
    model = _llama()
    with pytest.raises(InvalidRequestError, match="weights 'disk'"):
        pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), weights="disk")
    with pytest.raises(InvalidRequestError, match="lookahead must be at least 0, not -1"):
        pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), lookahead=-1)
    with pytest.raises(InvalidRequestError, match=r"lookahead 1\.5: give a whole number"):
        pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), lookahead=1.5)
    with pytest.raises(InvalidRequestError, match="overlap 'yes'"):
        pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), overlap="yes")


@pytest.mark.parametrize(
    ("value", "weights", "device", "says"),
    [(-1, "resident", "cuda", "at least 0"), ("2", "resident", "cuda", "give a whole number"),
     (True, "resident", "cuda", "give a whole number"), (2, "resident", "cpu", "name a GPU"),
     (2, "stream", "cpu", "name a GPU")],
)  # fmt: skip
def test_hbm_blocks_is_checked_where_it_enters(
    value: object, weights: str, device: str, says: str
) -> None:
    """Before anything is placed: the configuration (a CUDA device named, none needed to
    refuse it), and offload_model's own check on this GPU-less machine."""
    with pytest.raises(InvalidRequestError, match=f"hbm_blocks.*{says}|{says}"):
        OffloadConfig.checked(torch.device(device), weights=weights, hbm_blocks=value)
    if device == "cpu" or value != 2:
        model = _llama()
        with pytest.raises(InvalidRequestError, match=f"hbm_blocks.*{says}|{says}"):
            pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), hbm_blocks=value,
                                weights=weights)  # fmt: skip


class _Gated(torch.nn.Module):
    """A block whose second layer runs only while ``on`` (an expert that got no tokens)."""

    on = True

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 32)
        self.b = torch.nn.Linear(32, 32)

    def forward(self, h: Any) -> Any:
        h = torch.tanh(self.a(h))
        return torch.tanh(self.b(h)) if _Gated.on else h


class _Stack(torch.nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Gated() for _ in range(n))

    def forward(self, h: Any) -> Any:
        for block in self.blocks:
            h = block(h)
        return h


def _stacks(weights: str) -> tuple[Any, Any, Any, Any]:
    torch.manual_seed(0)
    ref = _Stack()
    model = copy.deepcopy(ref)
    adam = torch.optim.AdamW(model.parameters(), lr=1e-2)
    off = pycxl.offload_model(model, "dram0", None, optimizer=adam, weights=weights)
    return ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), model, off


@pytest.mark.parametrize("weights", ["resident", "stream"])
def test_a_parameter_that_skips_steps_counts_its_own_as_adam_does(weights: str) -> None:
    ref, opt, model, off = _stacks(weights)
    x = torch.randn(8, 32)
    for i in range(5):
        _Gated.on = i % 2 == 0  # the second layers take a gradient every other step
        for m, o in ((ref, opt), (model, off.optimizer)):
            m(x).square().mean().backward()
            o.step()
            o.zero_grad()
    _Gated.on = True
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    saved = off.optimizer.state_dict()["state"]
    assert {int(st["step"]) for st in saved.values()} == {5, 3}
    off.close()


def test_a_micro_batch_that_leaves_a_parameter_without_gradient_keeps_the_earlier_one() -> None:
    ref, opt, model, off = _stacks("stream")
    x = torch.randn(8, 32)
    for m, o in ((ref, opt), (model, off.optimizer)):
        for on in (True, False):  # two micro-batches; the second gives b no gradient
            _Gated.on = on
            m(x).square().mean().backward()
        _Gated.on = True
        grads = [p.grad.clone() for p in m.parameters()]
        o.step()
        o.zero_grad()
        if m is ref:
            want = grads
    for g, w in zip(grads, want, strict=True):
        assert torch.allclose(g, w, atol=1e-6)
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    off.close()


def test_a_forward_pass_between_a_forward_and_its_backward_leaves_the_gradients_right() -> None:
    ref, _, model, off = _stacks("stream")
    x, other = torch.randn(8, 32), torch.randn(8, 32)
    for m in (ref, model):
        loss = m(x).square().mean()
        with torch.no_grad():
            m(other)  # an evaluation pass: it takes the ring's buffers in between
        loss.backward(retain_graph=True)
        loss.backward()  # twice through one graph: the blocks are taken again
    for a, b in zip(ref.parameters(), model.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)
    off.close()


def test_a_closed_offload_says_so_and_bad_state_is_refused_by_name() -> None:
    _, _, model, off = _stacks("stream")
    saved = off.optimizer.state_dict()
    broken = copy.deepcopy(saved)
    broken["param_groups"] = broken["param_groups"] * 2
    with pytest.raises(InvalidRequestError, match="2 param groups"):
        off.optimizer.load_state_dict(broken)
    off.close()
    off.close()  # twice is once
    with pytest.raises(InvalidRequestError, match="closed"):
        off.optimizer.step()
    stray = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
    with pytest.raises(InvalidRequestError, match="does not hold"):
        pycxl.offload_model(model, "dram0", None, blocks=stray,
                            optimizer=torch.optim.AdamW(model.parameters()))  # fmt: skip


def test_streamed_blocks_train_with_nothing_copied_ahead() -> None:
    ref = _llama()
    model = copy.deepcopy(ref)
    off = pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), weights="stream",
                              lookahead=0)  # fmt: skip
    data = _data(3, micro=2)
    want = _train(ref, _adamw(ref), data, clip=0.5)
    got = _train(model, off.optimizer, data, clip=0.5)
    assert got == pytest.approx(want, abs=1e-4)
    assert off.ferry is not None and len(off.ferry.ring._slots) == 1  # one buffer, no more
    off.close()
