"""offload.save(folder) and offload.load(folder): an offloaded model and its optimizer
state written one tensor at a time from where each lives and read back into it; a run
resumed from the folder trains on as the one that saved it; the folder is a checkpoint
transformers and weights_from read; a folder of another model is refused before
anything changes; a save that fails leaves the folder as it was; and saving takes no
second copy of the state (optimizer.state_dict() does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError
from tests.training import train as _train

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")


def _model(seed: int, layers: int = 3, intermediate: int = 128) -> Any:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)


def _offload(model: Any, weights: str) -> Any:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    return pycxl.offload_model(model, "dram0", None, optimizer=opt, weights=weights)


def _weights(model: Any) -> dict[str, Any]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _assert_weights(model: Any, want: dict[str, Any]) -> None:
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), want[n]), n


def _data(steps: int, seed: int) -> list[list[Any]]:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randint(0, 256, (2, 32), generator=g)] for _ in range(steps)]


@pytest.mark.parametrize("weights", ["resident", "stream"])
def test_a_run_resumed_from_its_folder_trains_on_as_the_one_that_saved_it(
    tmp_path: Path, weights: str
) -> None:
    model = _model(0)
    off = _offload(model, weights)
    _train(model, off.optimizer, _data(3, 1), clip=0.5)
    off.optimizer.param_groups[0]["lr"] = 5e-4  # as a scheduler leaves it
    folder = off.save(tmp_path / "run")
    want = _train(model, off.optimizer, _data(3, 2), clip=0.5)
    trained = _weights(model)
    off.close()

    other = _model(7)  # other weights, a fresh optimizer: all of it comes from the folder
    resumed = _offload(other, weights)
    resumed.load(folder)
    assert resumed.optimizer.param_groups[0]["lr"] == 5e-4
    assert _train(other, resumed.optimizer, _data(3, 2), clip=0.5) == want  # bit for bit
    resumed.synchronize()
    _assert_weights(other, trained)
    resumed.close()


def test_the_folder_is_a_checkpoint_transformers_and_weights_from_read(tmp_path: Path) -> None:
    model = _model(0)
    off = _offload(model, "stream")
    _train(model, off.optimizer, _data(2, 1))
    folder = off.save(tmp_path / "run")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 4  # a file a block, one for the rest
    block = off._blocks[1]
    slot = block.params[0]
    name = next(n for n, p in model.named_parameters() if p is slot.param)
    with safetensors.safe_open(str(folder / "optimizer-00002-of-00004.safetensors"), "pt") as f:
        for k, which in (("master", 0), ("exp_avg", 1), ("exp_avg_sq", 2)):
            assert torch.equal(f.get_tensor(f"{name}.{k}"),
                               block.part(block.state, which, slot).view(slot.shape))  # fmt: skip
    loaded = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    _assert_weights(loaded, _weights(model))
    off.close()
    with torch.device("meta"):
        meta = transformers.LlamaForCausalLM(loaded.config).to(torch.bfloat16)
    opt = torch.optim.AdamW(meta.parameters(), lr=1e-3)
    built = pycxl.offload_model(meta, "dram0", None, optimizer=opt, weights="stream",
                                weights_from=folder)  # fmt: skip
    built.load(folder)
    _assert_weights(meta, _weights(loaded))
    built.close()


def test_a_folder_of_another_model_is_refused_before_anything_changes(tmp_path: Path) -> None:
    small = _model(0, intermediate=128)
    off = _offload(small, "resident")
    folder = off.save(tmp_path / "run")
    off.close()
    wide = _model(1, intermediate=256)
    target = _offload(wide, "resident")
    before = _weights(wide)
    with pytest.raises(InvalidRequestError, match=r"mlp.* is BF16 \[128, 64\], this model's"):
        target.load(folder)
    deeper = _model(1, layers=4)
    deep = _offload(deeper, "resident")
    with pytest.raises(InvalidRequestError, match=r"no entry for model.layers.3.* load a folder"):
        deep.load(folder)
    deep.close()
    shallower = _model(1, layers=2)  # the folder holds a layer it does not have
    shallow = _offload(shallower, "resident")
    with pytest.raises(InvalidRequestError, match=r"holds \d+ tensors or entries this model"):
        shallow.load(folder)
    shallow.close()
    same = _model(2)
    like = _offload(same, "resident")
    kept = _weights(same)
    settings = json.loads((folder / "optimizer.json").read_text())
    for bad, match in (
        ({"param_groups": [7]}, "param group 0 is not one"),
        ({"param_groups": [{"lr": "fast"}]}, "param group 0's lr is 'fast'"),
        ({"param_groups": []}, "0 param groups saved, the optimizer has 1"),
        ({"params": {n: {"step": True, "group": 0} for n in settings["params"]}},
         "is not a step count and a param group"),
        ({"params": {n: {"step": 1, "group": 1} for n in settings["params"]}},
         "is not a step count and a param group of 1"),  # a group the optimizer lacks
        ({"files": ["../x.safetensors"]}, "is not a file a save writes"),
        ({"save": "other"}, "is of another save than optimizer.json"),
        ({"format": 2}, "is not of format 1"),
    ):  # fmt: skip
        (folder / "optimizer.json").write_text(json.dumps({**settings, **bad}))
        with pytest.raises(InvalidRequestError, match=match):
            like.load(folder)
    _assert_weights(same, kept)
    like.close()
    with pytest.raises(InvalidRequestError, match="is not a folder an offload saved"):
        target.load(tmp_path / "nothing")
    _assert_weights(wide, before)
    target.close()


def test_a_save_that_fails_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    model = _model(0)
    off = _offload(model, "resident")
    folder = off.save(tmp_path / "run")
    kept = {f.name: f.read_bytes() for f in folder.iterdir()}
    _train(model, off.optimizer, _data(1, 1))
    off.optimizer.param_groups[0]["custom"] = object()  # a setting JSON cannot hold
    with pytest.raises(InvalidRequestError, match="of type object cannot be saved"):
        off.save(folder)
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == kept
    del off.optimizer.param_groups[0]["custom"]
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidRequestError, match="is a file, not a folder"):
        off.save(tmp_path / "file")
    with pytest.raises(InvalidRequestError, match=r"saving into .* failed .* folder is as it was"):
        off.save(tmp_path / "file" / "under")  # a file where a folder would be made
    off.close()


def test_a_save_over_another_replaces_it_and_files_of_two_saves_are_refused(
    tmp_path: Path,
) -> None:
    deep = _model(0, layers=4)
    off = _offload(deep, "resident")
    _train(deep, off.optimizer, _data(2, 1))
    folder = off.save(tmp_path / "run")
    first = {f.name for f in folder.iterdir()}
    off.close()
    shallow = _model(1, layers=3)  # fewer files than the first save's
    fresh = _offload(shallow, "resident")
    fresh.save(folder)
    left = {f.name for f in folder.iterdir()}
    assert "optimizer-00005-of-00005.safetensors" in first - left  # the first save's: gone
    other = _model(2, layers=3)
    again = _offload(other, "resident")
    again.load(folder)
    _assert_weights(other, _weights(shallow))
    master = again.master_weights(other.model.layers[0].mlp.up_proj.weight)
    assert torch.equal(master, fresh.master_weights(shallow.model.layers[0].mlp.up_proj.weight))
    # a file of another save copied in (or a save cut short while renaming)
    elsewhere = fresh.save(tmp_path / "elsewhere")
    name = "optimizer-00001-of-00004.safetensors"
    (folder / name).write_bytes((elsewhere / name).read_bytes())
    with pytest.raises(InvalidRequestError, match=f"{name} is of another save"):
        again.load(folder)
    (folder / name).unlink()
    os.mkfifo(folder / name)  # never opened: a read would block
    with pytest.raises(InvalidRequestError, match="is not a regular file"):
        again.load(folder)
    fresh.close()
    again.close()


SAVE_PEAK = """
import sys, torch, transformers, pycxl
torch.manual_seed(0)
cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=2048,
                               num_hidden_layers=8, num_attention_heads=8)
model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
off = pycxl.offload_model(model, "dram0", None, optimizer=opt)
state = sum(t.numel() * t.element_size() for t in off.host_tensors())
def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size starts again from now (Linux >= 4.0)
before = status("VmRSS")
kept = off.save(sys.argv[1]) if len(sys.argv) > 1 else off.optimizer.state_dict()
print(state, status("VmHWM") - before)
"""


def test_saving_takes_no_second_copy_of_the_state(tmp_path: Path) -> None:
    def rise(*how: str) -> tuple[int, int]:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(SAVE_PEAK), *how],
                              capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
        state, grew = map(int, done.stdout.split()[-2:])
        return state, grew

    state, saved = rise(str(tmp_path / "run"))
    assert state > 300 << 20  # the blocks' fp32 state and pinned buffers on the tier
    _, cloned = rise()  # what optimizer.state_dict() takes
    assert saved < state // 10 < cloned, (saved, cloned, state)
