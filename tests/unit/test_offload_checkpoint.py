"""offload_model(weights_from=...): a model built on the meta device made straight into its
placement from a safetensors checkpoint, one tensor at a time, trains as the model the
checkpoint was saved from; a checkpoint that does not match is refused before any
memory is taken."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError
from tests.training import train as _train

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
LR = 1e-3


def _config(tied: bool = False, layers: int = 3) -> Any:
    return transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=tied,
    )  # fmt: skip


def _saved(tmp_path: Path, cfg: Any, dtype: Any = None) -> tuple[Any, Path]:
    """A model and the folder its sharded checkpoint is saved in."""
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(cfg)
    if dtype is not None:
        ref = ref.to(dtype)
    folder = tmp_path / "ckpt"
    ref.save_pretrained(folder, max_shard_size="60KB")  # several files and their index
    return ref, folder


def _on_meta(cfg: Any, dtype: Any = None) -> Any:
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    return model if dtype is None else model.to(dtype)


def _data(steps: int) -> list[list[Any]]:
    g = torch.Generator().manual_seed(1)
    return [[torch.randint(0, 256, (2, 32), generator=g)] for _ in range(steps)]


def _adamw(model: Any) -> Any:
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)


@pytest.mark.parametrize(("weights", "tied"), [("resident", False), ("stream", False),
                                               ("stream", True)])  # fmt: skip
def test_a_model_built_on_meta_trains_from_its_checkpoint_as_the_saved_one(
    tmp_path: Path, weights: str, tied: bool
) -> None:
    cfg = _config(tied)
    ref, folder = _saved(tmp_path, cfg)
    assert (folder / "model.safetensors.index.json").is_file()
    model = _on_meta(cfg)
    assert all(p.is_meta for p in model.parameters())
    idents = [id(p) for p in model.parameters()]
    off = pycxl.offload_model(
        model, "dram0", None, optimizer=_adamw(model), weights=weights, weights_from=folder
    )
    assert [id(p) for p in model.parameters()] == idents  # the optimizer's, the same objects
    assert not any(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())  # rotary frequencies computed
    assert torch.equal(model.model.rotary_emb.inv_freq, ref.model.rotary_emb.inv_freq)
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    data = _data(4)
    want = _train(ref, _adamw(ref), data, clip=0.5)
    got = _train(model, off.optimizer, data, clip=0.5)
    assert got == pytest.approx(want, abs=1e-4)
    off.close()


def test_the_master_starts_from_the_checkpoints_precision_and_the_weights_are_rounded(
    tmp_path: Path,
) -> None:
    """An fp32 checkpoint into a bf16 model: the weights are the values rounded, the
    fp32 master the values themselves; streamed, each block's weights live at home."""
    cfg = _config()
    ref, folder = _saved(tmp_path, cfg)  # fp32
    model = _on_meta(cfg, torch.bfloat16)
    off = pycxl.offload_model(
        model, "dram0", None, optimizer=_adamw(model), weights="stream", weights_from=folder
    )
    B = off._blocks[0]
    p = B.params[0]
    name = next(n for n, q in model.named_parameters() if q is p.param)
    want = ref.get_parameter(name).detach()
    assert torch.equal(B.part(B.state, 0, p).view(p.shape), want)
    assert not torch.equal(want.to(torch.bfloat16).float(), want)  # rounding shows
    assert torch.equal(p.param.detach(), want.to(torch.bfloat16))
    assert p.param.data_ptr() == B.weights.data_ptr() + p.offset * 2  # made at home
    off.close()


def test_a_checkpoint_that_does_not_match_is_refused_before_anything_is_made(
    tmp_path: Path,
) -> None:
    _, folder = _saved(tmp_path, _config(layers=2))
    model = _on_meta(_config(layers=3))  # a layer more than the checkpoint
    with pytest.raises(InvalidRequestError, match=r"model.layers.2.* is not in the checkpoint"):
        pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), weights_from=folder)
    assert all(p.is_meta for p in model.parameters())  # nothing made
    wide = _config(layers=2)
    wide.intermediate_size = 256
    model = _on_meta(wide)
    with pytest.raises(InvalidRequestError, match=r"is \[128, 64\] in the checkpoint"):
        pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model), weights_from=folder)
    assert all(p.is_meta for p in model.parameters())


def test_bad_checkpoint_paths_and_a_meta_model_without_one_are_refused_by_name(
    tmp_path: Path,
) -> None:
    model = _on_meta(_config(layers=2))
    opt = _adamw(model)
    with pytest.raises(InvalidRequestError, match="no such file or folder"):
        pycxl.offload_model(model, "dram0", None, optimizer=opt, weights_from=tmp_path / "x")
    os.mkfifo(tmp_path / "model.safetensors")  # never opened: a read would block
    with pytest.raises(InvalidRequestError, match=r"no \.safetensors file there"):
        pycxl.offload_model(model, "dram0", None, optimizer=opt, weights_from=tmp_path)
    with pytest.raises(InvalidRequestError, match="is not a regular file or a folder"):
        pycxl.offload_model(model, "dram0", None, optimizer=opt,
                            weights_from=tmp_path / "model.safetensors")  # fmt: skip
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weights": {}}))
    with pytest.raises(InvalidRequestError, match="is not a safetensors index"):
        pycxl.offload_model(model, "dram0", None, optimizer=opt, weights_from=tmp_path)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00[1,2]")
    with pytest.raises(InvalidRequestError, match="is not a safetensors file"):
        pycxl.offload_model(model, "dram0", None, optimizer=opt, weights_from=bad)
    for weights in ("resident", "stream"):
        with pytest.raises(InvalidRequestError, match=r"on the meta device.*weights_from"):
            pycxl.offload_model(model, "dram0", None, optimizer=opt, weights=weights)
    assert all(p.is_meta for p in model.parameters())


def test_a_model_built_on_meta_is_made_by_its_own_initialisation_the_same_in_either_placement() -> (
    None
):
    """initialise=True: each module initialised as the model initialises it, from a seed
    of its own, so resident and streamed placements start from the same values and train
    to the same losses."""
    cfg = _config()
    ref = transformers.LlamaForCausalLM(cfg)  # built on the CPU: the distributions to match
    got = {}
    for weights in ("resident", "stream"):
        model = _on_meta(cfg)
        torch.manual_seed(0)
        off = pycxl.offload_model(model, "dram0", None, optimizer=_adamw(model),
                                  weights=weights, initialise=True)  # fmt: skip
        assert not any(p.is_meta for p in model.parameters())
        assert torch.equal(model.model.rotary_emb.inv_freq, ref.model.rotary_emb.inv_freq)
        values = {n: p.detach().clone() for n, p in model.named_parameters()}
        losses = _train(model, off.optimizer, _data(3), clip=0.5)
        off.close()
        got[weights] = values, losses
    values, losses = got["resident"]
    assert got["stream"][0].keys() == values.keys()
    assert all(torch.equal(got["stream"][0][n], v) for n, v in values.items())
    assert got["stream"][1] == pytest.approx(losses, abs=1e-5) and losses[-1] < losses[0]
    for n, p in ref.named_parameters():
        if "norm" in n:
            assert torch.equal(values[n], torch.ones_like(values[n])), n
        else:  # normal(0, initializer_range), as transformers draws them on the CPU
            assert float(values[n].std()) == pytest.approx(float(p.detach().std()), rel=0.1), n
    # every module of the model has a seed of its own: not two alike
    blocks = [values[f"model.layers.{i}.mlp.up_proj.weight"] for i in range(cfg.num_hidden_layers)]
    assert not torch.equal(blocks[0], blocks[1])


def test_initialise_refuses_a_parameter_it_cannot_set_and_a_checkpoint_beside_it(
    tmp_path: Path,
) -> None:
    class Scaled(torch.nn.Module):  # a parameter no initialisation sets
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.empty(64))

        def forward(self, x: Any) -> Any:
            return x * self.scale

    model = _on_meta(_config(layers=2))
    with torch.device("meta"):
        model.model.layers[1].post_scale = Scaled()
    opt = _adamw(model)
    with pytest.raises(InvalidRequestError, match=r"layers\.1\.post_scale\.scale \(Scaled\) "
                       r"is set by neither.*weights_from="):  # fmt: skip
        pycxl.offload_model(model, "dram0", None, optimizer=opt, initialise=True)
    assert all(p.is_meta for p in model.parameters())  # refused while nothing was made
    with pytest.raises(InvalidRequestError, match=r"weights_from .* or initialise=True"):
        pycxl.offload_model(model, "dram0", None, optimizer=opt, initialise=True,
                            weights_from=tmp_path)  # fmt: skip
    with pytest.raises(InvalidRequestError, match="initialise 'yes': give True or False"):
        pycxl.offload_model(model, "dram0", None, optimizer=opt, initialise="yes")  # type: ignore[arg-type]
    built = transformers.LlamaForCausalLM(_config(layers=2))
    with pytest.raises(InvalidRequestError, match="holds values already: initialise=True"):
        pycxl.offload_model(built, "dram0", None, optimizer=_adamw(built), initialise=True)
