"""Layer streaming and optimizer offload for PyTorch (pycxl.offload_layers) on the CPU:
the hooks, the parameters pointed in and out of ring buffers, gradients copied back,
and Adam's state on a tier give the same model as plain PyTorch training. The GPU
tests (tests/gpu/test_gpu_offload.py) run the same on the CUDA engine."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError, NotFoundError
from pycxl.gpu.host_engine import HostEngine
from pycxl.torch.offload.layers import LayerOffload

torch = pytest.importorskip("torch")


def _model(layers: int = 4, width: int = 32) -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[
        torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())
        for _ in range(layers)
    ])  # fmt: skip


def _batches(steps: int, width: int = 32) -> list[tuple[Any, Any]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, width, generator=g), torch.randn(8, width, generator=g))
            for _ in range(steps)]  # fmt: skip


def _train(model: Any, batches: list[tuple[Any, Any]], opt: Any = None) -> list[float]:
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        losses.append(loss.item())
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return losses


def _on_tier(node: int) -> Any:
    def host_alloc(nbytes: int, pinned: bool) -> Any:
        assert not pinned  # no GPU: nothing to pin for
        buf = pycxl.allocate(nbytes, node)
        return torch.from_numpy(buf.array("uint8"))

    return host_alloc


ADAM = functools.partial(torch.optim.Adam, lr=1e-2)


def _same(a: Any, b: Any) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.allclose(p.detach(), q.detach(), atol=1e-6, rtol=1e-5), name


def test_resident_layers_on_the_cpu_train_like_plain_pytorch_with_state_on_the_tier() -> None:
    model, ref = _model(), _model()
    batches = _batches(4)
    offload = pycxl.offload_layers(list(model), "dram0", gpu=None, weights="resident",
                                   optimizer=ADAM)  # fmt: skip
    got = _train(model, batches)
    offload.synchronize()
    want = _train(ref, batches, ADAM(ref.parameters()))
    assert got == pytest.approx(want, rel=1e-5)
    _same(model, ref)
    node = pycxl.snapshot(gpus=False).resolve("dram0").node
    pages = offload.pages_by_node()
    assert set(pages) == {node} and pages[node] > 0
    # the parameters are the tier's memory, updated in place
    assert {t.data_ptr() for t in offload.host_tensors()} >= {
        p.data_ptr() for p in model.parameters()
    }
    offload.close()


@pytest.mark.parametrize("lookahead", [0, 1, 2])
def test_streamed_layers_train_like_plain_pytorch(lookahead: int) -> None:
    model, ref = _model(), _model()
    batches = _batches(5)
    node = pycxl.snapshot(gpus=False).resolve("dram0").node
    offload = LayerOffload(list(model), _on_tier(node), engine=HostEngine(), device="cpu",
                           weights="stream", lookahead=lookahead, optimizer=ADAM)  # fmt: skip
    got = _train(model, batches)
    with torch.no_grad():
        out = model(batches[0][0])
    offload.synchronize()
    want = _train(ref, batches, ADAM(ref.parameters()))
    assert got == pytest.approx(want, rel=1e-5)
    with torch.no_grad():
        assert torch.allclose(out, ref(batches[0][0]), atol=1e-6)
    # between uses a streamed parameter is its home: memory on the tier, its value
    homes = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
             for t in offload.host_tensors()]  # fmt: skip
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert any(lo <= p.data_ptr() < hi for lo, hi in homes)
        assert torch.allclose(p.detach(), q.detach(), atol=1e-6, rtol=1e-5)
    stats = offload.stats()
    assert stats.updates == 4 * 5
    assert stats.copies_to_device + stats.reused >= 5 * 8  # two uses per layer and step
    assert stats.reused > 0  # the layers at the turn of each step stay in the ring
    offload.close()


def test_streamed_gradients_land_on_the_tier_without_an_optimizer() -> None:
    model, ref = _model(layers=3), _model(layers=3)
    node = pycxl.snapshot(gpus=False).resolve("dram0").node
    offload = LayerOffload(list(model), _on_tier(node), engine=HostEngine(), device="cpu")
    ((x, y),) = _batches(1)
    _train(model, [(x, y)])
    _train(ref, [(x, y)])
    for i, layer in enumerate(ref):
        for got, p in zip(offload.host_grads(i), layer.parameters(), strict=True):
            assert torch.allclose(got, p.grad, atol=1e-6)
    assert set(offload.pages_by_node()) == {node}
    offload.close()


def test_adamw_with_amsgrad_keeps_every_moment_on_the_tier() -> None:
    model, ref = _model(layers=2), _model(layers=2)
    adamw = functools.partial(torch.optim.AdamW, lr=1e-2, amsgrad=True)
    offload = pycxl.offload_layers(list(model), "dram0", gpu=None, weights="resident",
                                   optimizer=adamw)  # fmt: skip
    batches = _batches(3)
    _train(model, batches)
    offload.synchronize()
    _train(ref, batches, adamw(ref.parameters()))
    _same(model, ref)
    held = {t.data_ptr() for t in offload.host_tensors()}
    for U in offload._updates:
        for st in U.optimizer.state.values():
            assert {st["exp_avg"].data_ptr(), st["max_exp_avg_sq"].data_ptr()} <= held
    offload.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"weights": "stream"}, InvalidRequestError, "streams to a GPU"),
        ({"weights": "resident"}, InvalidRequestError, "give an optimizer"),
        ({"weights": "sometimes"}, InvalidRequestError, "'stream' or 'resident'"),
        ({"weights": "resident", "optimizer": functools.partial(torch.optim.SGD, lr=0.1)},
         InvalidRequestError, "Adam and AdamW"),
    ],
)  # fmt: skip
def test_bad_requests_are_refused_before_training(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    model = _model(layers=2)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(error, match=words):
        pycxl.offload_layers(list(model), "dram0", gpu=None, **kwargs)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_unknown_tiers_and_layers_without_parameters_are_refused() -> None:
    with pytest.raises(NotFoundError, match="cxl9"):
        pycxl.offload_layers(list(_model(2)), "cxl9", gpu=None, weights="resident",
                             optimizer=ADAM)  # fmt: skip
    with pytest.raises(InvalidRequestError, match="no parameters"):
        pycxl.offload_layers([torch.nn.ReLU()], "dram0", gpu=None, weights="resident",
                             optimizer=ADAM)  # fmt: skip


def test_frozen_layers_stream_and_the_rest_trains_like_plain_pytorch() -> None:
    model, ref = _model(), _model()
    for m in (model, ref):
        m[1].requires_grad_(False)  # a frozen layer in the middle (fine-tuning the rest)
    node = pycxl.snapshot(gpus=False).resolve("dram0").node
    offload = LayerOffload(list(model), _on_tier(node), engine=HostEngine(), device="cpu",
                           weights="stream", optimizer=ADAM)  # fmt: skip
    batches = _batches(4)
    got = _train(model, batches)
    offload.synchronize()
    want = _train(ref, batches, ADAM([p for p in ref.parameters() if p.requires_grad]))
    assert got == pytest.approx(want, rel=1e-5)
    offload.close()


def test_a_model_without_gradients_streams_for_inference() -> None:
    model, ref = _model(layers=3), _model(layers=3)
    model.requires_grad_(False)
    node = pycxl.snapshot(gpus=False).resolve("dram0").node
    offload = LayerOffload(list(model), _on_tier(node), engine=HostEngine(), device="cpu")
    ((x, _),) = _batches(1)
    for _ in range(3):
        assert torch.allclose(model(x), ref(x), atol=1e-6)  # grad mode on, nothing to train
    assert offload.stats().copies_to_device == 3 * 3 + 1  # cyclic: one past the end
    offload.close()


def test_streamed_gradients_add_up_across_backward_passes_as_plain_pytorch() -> None:
    model, ref = _model(layers=3), _model(layers=3)
    node = pycxl.snapshot(gpus=False).resolve("dram0").node
    offload = LayerOffload(list(model), _on_tier(node), engine=HostEngine(), device="cpu")
    batches = _batches(2)
    _train(model, batches)  # two backward passes, no zero_grad between them
    _train(ref, batches)
    for i, layer in enumerate(ref):
        got = offload.host_grads(i)
        for g, p, q in zip(got, model[i].parameters(), layer.parameters(), strict=True):
            assert p.grad is not None and p.grad.data_ptr() == g.data_ptr()
            assert torch.allclose(g, q.grad, atol=1e-6)
    offload.close()


def test_checkpointed_layers_stream_and_train_like_plain_pytorch() -> None:
    from torch.utils.checkpoint import checkpoint

    model, ref = _model(), _model()
    node = pycxl.snapshot(gpus=False).resolve("dram0").node
    offload = LayerOffload(list(model), _on_tier(node), engine=HostEngine(), device="cpu",
                           weights="stream", optimizer=ADAM)  # fmt: skip

    def forward(net: Any, x: Any) -> Any:
        for layer in net:
            x = checkpoint(layer, x, use_reentrant=False)
        return x

    got, want = [], []
    opt = ADAM(ref.parameters())
    for x, y in _batches(3):
        loss = torch.nn.functional.mse_loss(forward(model, x), y)
        loss.backward()
        got.append(loss.item())
        loss = torch.nn.functional.mse_loss(forward(ref, x), y)
        loss.backward()
        want.append(loss.item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    offload.synchronize()
    assert got == pytest.approx(want, rel=1e-5)
    offload.close()


def test_a_layer_mixing_dtypes_is_refused_by_name() -> None:
    layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8).double())
    node = pycxl.snapshot(gpus=False).resolve("dram0").node
    with pytest.raises(InvalidRequestError, match="mixes parameter dtypes"):
        LayerOffload([layer], _on_tier(node), engine=HostEngine(), device="cpu")


def test_an_optimizer_of_the_users_over_streamed_layers_trains_like_plain_pytorch() -> None:
    """Between uses a streamed parameter is its home: an optimizer that changes it there
    (in place) is seen, and the layer runs with the new weights next time."""
    model, ref = _model(), _model()
    node = pycxl.snapshot(gpus=False).resolve("dram0").node
    offload = LayerOffload(list(model), _on_tier(node), engine=HostEngine(), device="cpu")
    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    batches = _batches(4)
    got = _train(model, batches, sgd(model.parameters()))
    want = _train(ref, batches, sgd(ref.parameters()))
    assert got == pytest.approx(want, rel=1e-5)
    _same(model, ref)
    assert offload.stats().reused > 0  # the layers at the turn: copied again once changed
    offload.close()


class _WithUnused(torch.nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.used = torch.nn.Linear(width, width)
        self.unused = torch.nn.Linear(width, width)  # takes no gradient

    def forward(self, x: Any) -> Any:
        return torch.tanh(self.used(x))


@pytest.mark.parametrize("weights", ["stream", "resident"])
def test_a_layer_whose_parameter_takes_no_gradient_still_trains_the_rest(weights: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(_WithUnused(), _WithUnused())
    ref = copy.deepcopy(model)
    if weights == "stream":
        node = pycxl.snapshot(gpus=False).resolve("dram0").node
        offload = LayerOffload(list(model), _on_tier(node), engine=HostEngine(), device="cpu",
                               weights="stream", optimizer=ADAM)  # fmt: skip
    else:
        offload = pycxl.offload_layers(list(model), "dram0", gpu=None, weights="resident",
                                       optimizer=ADAM)  # fmt: skip
    batches = _batches(3)
    got = _train(model, batches)
    offload.synchronize()
    want = _train(ref, batches, ADAM(ref.parameters()))  # Adam skips what has no gradient
    assert got == pytest.approx(want, rel=1e-5)
    _same(model, ref)
    assert offload.stats().updates == 2 * 3
    offload.close()


def test_resident_layers_keep_frozen_and_mixed_dtype_parameters_on_the_tier() -> None:
    """A frozen base weight beside a trained one (LoRA's shape), and a layer norm in
    fp32 beside a bf16 linear: on the CPU every parameter lives on the tier."""
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(32, 32).to(torch.bfloat16), torch.nn.LayerNorm(32))
    layer[0].weight.requires_grad_(False)
    model = torch.nn.Sequential(copy.deepcopy(layer), copy.deepcopy(layer))
    ref = copy.deepcopy(model)
    offload = pycxl.offload_layers(list(model), "dram0", gpu=None, weights="resident",
                                   optimizer=ADAM)  # fmt: skip
    held = {t.data_ptr() for t in offload.host_tensors()}
    homes = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
             for t in offload.host_tensors()]  # fmt: skip
    for p in model.parameters():
        assert any(lo <= p.data_ptr() < hi for lo, hi in homes), p.shape
    assert held
    batches = [(x.to(torch.bfloat16), y.to(torch.bfloat16)) for x, y in _batches(3)]

    def loop(m: Any, opt: Any = None) -> list[float]:
        out = []
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(m(x).float(), y.float())
            loss.backward()
            out.append(loss.item())
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
        return out

    got = loop(model)
    offload.synchronize()
    want = loop(ref, ADAM([p for p in ref.parameters() if p.requires_grad]))
    assert got == pytest.approx(want, rel=1e-2)  # bf16 rounds where fp32 masters differ
    assert torch.equal(model[0][0].weight, ref[0][0].weight)  # frozen: untouched
    offload.close()


def test_a_layer_holding_only_an_earlier_layers_parameters_is_refused() -> None:
    shared = torch.nn.Linear(8, 8)
    with pytest.raises(InvalidRequestError, match="no parameters of its own"):
        pycxl.offload_layers([shared, shared], "dram0", gpu=None, weights="resident",
                             optimizer=ADAM)  # fmt: skip
