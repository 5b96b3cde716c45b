"""pycxl.fit and pycxl plan-train without a GPU: a decoder's shape counted as its
published count, or read from a model (meta included); the tier's bytes as
offload_model lays the state out; the activation estimate against what autograd saves
for transformers' Llama here; placements chosen by memory and by the rates' bound; bad
input refused by name; the command's exit codes and JSON."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError
from pycxl.base.values import parameter_count
from pycxl.torch.offload.fit import Machine, fit, hbm_headroom, step_peak
from pycxl.torch.offload.train_shape import LOGIT_BYTES, TrainShape, activation_bytes

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
GiB = 1 << 30
LLAMA2_13B = TrainShape.decoder(layers=40, hidden=5120, intermediate=13824)


def _llama(layers: int, hidden: int = 64, intermediate: int = 128, vocab: int = 256) -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=hidden // 64 or 1,
        num_key_value_heads=hidden // 64 or 1, max_position_embeddings=1024,
        attn_implementation="sdpa",
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg)


def test_a_decoder_shape_counts_as_its_published_count() -> None:
    assert LLAMA2_13B.params == 13_015_864_320  # Llama 2 13B's
    assert TrainShape.decoder(layers=32, hidden=4096).intermediate == 11008  # Llama 2 7B's
    with_count = TrainShape.decoder(layers=40, hidden=5120, params=13 * 10**9)
    assert with_count.rest_params == LLAMA2_13B.rest_params
    assert with_count.block_params == 13 * 10**9 - LLAMA2_13B.rest_params
    assert parameter_count("13B") == 13 * 10**9 and parameter_count("350M") == 350 * 10**6


def test_the_shape_of_a_model_is_read_from_it_on_the_meta_device_too() -> None:
    with torch.device("meta"):
        model = _llama(3)
    shape = TrainShape.of_model(model)
    in_layers = sum(p.numel() for p in model.model.layers.parameters())
    assert shape.block_params == in_layers and shape.layers == 3
    assert shape.rest_params == sum(p.numel() for p in model.parameters()) - in_layers
    assert (shape.hidden, shape.intermediate, shape.vocab, shape.dtype_bytes) == (64, 128, 256, 4)


def test_the_tier_holds_the_state_as_offload_model_lays_it_out() -> None:
    from pycxl.torch.offload.layout import find_blocks, layout_blocks

    model = _llama(3)
    group_of = {id(p): 0 for p in model.parameters()}
    blocks = layout_blocks(find_blocks(model), group_of, with_frozen=False)
    laid_out = sum(3 * B.numel * 4 for B in blocks)  # what model_setup.place_state takes
    planned = fit(TrainShape.of_model(model), Machine("dram0", None, 1 << 40), 64)
    state = planned.options[0].tier["optimizer_state"]
    assert laid_out * 0.98 <= state <= laid_out  # the layout's alignment is the difference


def _saved_bytes(model: Any, tokens: int) -> int:
    """What autograd keeps for the backward pass of one step (storages, each once),
    less the parameters and the input."""
    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    return sum(n for ptr, n in seen.items() if ptr not in params | {ids.data_ptr()})


def test_the_activation_estimate_is_what_autograd_saves_for_a_llama_block() -> None:
    tokens, counted = 1024, []
    for hidden, intermediate in ((512, 1376), (1024, 2816)):
        two, four = (_llama(n, hidden, intermediate, 4000).to(torch.bfloat16) for n in (2, 4))
        per_two_blocks = _saved_bytes(four, tokens) - _saved_bytes(two, tokens)
        shape = TrainShape.of_model(four)
        estimate = activation_bytes(shape, tokens, False) * 2 // 4
        estimate -= LOGIT_BYTES * 4000 * tokens // 2  # the blocks' share only
        counted.append(estimate / per_two_blocks)
    assert all(0.85 <= r <= 1.15 for r in counted), counted


def _machine(hbm: float, tier: float, **rates: float) -> Machine:
    return Machine("dram0", int(hbm * GiB), int(tier * GiB), **rates)


def test_the_placement_is_the_fastest_that_fits() -> None:
    shape = TrainShape.decoder(layers=22, hidden=2048, intermediate=5632)  # a 1.1B
    roomy = fit(shape, _machine(139, 100), 4096)
    assert roomy.chosen is not None and roomy.chosen.name == "resident"
    tight = fit(shape, _machine(12, 100), 4096)  # activations and resident weights do not fit
    assert tight.chosen is not None and tight.chosen.name.startswith("resident + checkpointing")
    assert tight.chosen.checkpointed_blocks > 0  # only some: the rates unknown, less recomputed
    rates = {"link": 50e9, "cpu_update": 2e9, "gpu_flops": 600e12}
    timed = fit(shape, _machine(139, 100, **rates), 4096)
    steps = [o.step_s for o in timed.options]
    assert None not in steps and steps == sorted(steps)  # type: ignore[type-var]
    assert timed.chosen is timed.options[0] and "bound by" in timed.chosen.bound
    slow_gpu = fit(shape, _machine(139, 100, link=50e9, cpu_update=2e9, gpu_flops=1e12), 4096)
    assert slow_gpu.options[0].bound.startswith("bound by compute")


def test_hbm_holds_what_offload_model_puts_there() -> None:
    from pycxl.torch.offload.ferry import LANDING_MAX
    from pycxl.torch.offload.gpu_side import CHUNK_ELEMENTS, SLOTS

    shape = TrainShape.decoder(layers=22, hidden=2048, intermediate=5632)
    block = -(-shape.block_params // 22)
    # HBM's free memory not known: no block's state is placed there
    planned = {o.name: o for o in fit(shape, Machine("dram0", None, 100 * GiB), 4096,
                                      lookahead=2).options}  # fmt: skip
    streamed, resident = planned["stream"].hbm, planned["resident"].hbm
    assert streamed["block_weights"] == 3 * block * 2  # the ring: lookahead + 1 blocks
    assert resident["block_weights"] == shape.block_params * 2
    # 4096 tokens kept whole: the peak is as the forward pass ends, the logits made and
    # no gradient yet
    for at_peak in (streamed, resident):
        assert at_peak["block_gradients"] == 0
        assert at_peak["activations_estimate"] == activation_bytes(shape, 4096, 0)
    # 256 tokens checkpointed: at the backward pass's end, block 0's input and its
    # recompute beside the gradients kept (resident: every block's)
    few = {o.name: o.hbm for o in fit(shape, Machine("dram0", None, 100 * GiB), 256).options}
    last = 256 * 2 * 2048 + 256 * (24 * 2048 + 8 * 5632)
    assert few["resident + checkpointing"]["block_gradients"] == 22 * block * 2
    assert few["resident + checkpointing"]["activations_estimate"] == last
    # streamed, the first `held` blocks' gradients kept and the others' on their way
    # home: this block's and the LANDING_MAX after it
    assert step_peak(shape, 256, True, stream=True, held=5) == (5 * block * 2, last)
    # none or one held: the window's three blocks at block 19, the inputs of 0-19 kept
    window = ((LANDING_MAX + 1) * block * 2, last + 19 * 256 * 2 * 2048)
    assert step_peak(shape, 256, True, stream=True, held=1) == window
    assert step_peak(shape, 256, True, stream=True, held=0) == window
    # fp32 master and two moments, bf16 weights and gradient, a piece each of SLOTS buffers
    assert resident["update_buffers"] == SLOTS * min(CHUNK_ELEMENTS, block) * (4 * 4 + 2 * 2)
    # where the rates give every block to the CPU, the GPU side takes no buffers
    cpu_only = fit(shape, Machine("dram0", None, 100 * GiB, link=1e6, cpu_update=1e12,
                                  gpu_flops=1e15), 4096)  # fmt: skip
    assert all(o.hbm["update_buffers"] == 0 for o in cpu_only.options)


def test_frozen_parameters_and_accumulation_are_placed_as_offload_model_places_them() -> None:
    model = _llama(3)
    for b in model.model.layers:
        b.mlp.requires_grad_(False)  # the MLPs frozen: weights, no gradients or state
    shape = TrainShape.of_model(model)
    frozen = sum(p.numel() for b in model.model.layers for p in b.mlp.parameters())
    assert shape.frozen_block_params == frozen
    assert shape.block_params == sum(p.numel() for p in model.model.layers.parameters()) - frozen
    planned = {o.name: o for o in fit(shape, Machine("dram0", None, 1 << 40), 64).options}
    n, d = shape.block_params, shape.dtype_bytes
    assert planned["resident"].hbm["block_weights"] == (n + frozen) * d
    # the gradients at the backward pass's end (a vocabulary of one: no logits to speak
    # of): the trainable parameters' alone
    assert step_peak(dataclasses.replace(shape, vocab=1), 1, True, stream=False)[0] == n * d
    assert planned["stream"].tier["pinned_gradients_weights"] == (2 * n + frozen) * d
    accumulated = {o.name: o for o in fit(shape, Machine("dram0", None, 1 << 40), 64,
                                          accumulation=4).options}  # fmt: skip
    assert accumulated["stream"].tier["pinned_gradients_weights"] == (3 * n + frozen) * d
    assert accumulated["resident"].tier == planned["resident"].tier


def test_the_link_carries_what_each_placement_moves_a_step() -> None:
    shape = TrainShape.decoder(layers=24, hidden=2048)
    n, d = shape.block_params, shape.dtype_bytes
    # a CPU so fast that the split gives it every block: only weights and gradients move
    m = Machine("dram0", None, 400 * GiB, link=1e10, cpu_update=1e15, gpu_flops=1e15)
    planned = {o.name: o for o in fit(shape, m, 4096).options}
    block = -(-n // 24)
    assert planned["resident"].parts_s["link"] == pytest.approx(24 * block * d / 1e10)
    assert planned["stream"].parts_s["link"] == pytest.approx(3 * n * d / 1e10)
    four = {o.name: o for o in fit(shape, m, 4096, accumulation=4).options}
    assert four["stream"].parts_s["link"] == pytest.approx(4 * 3 * n * d / 1e10)
    assert four["resident"].parts_s["compute"] == pytest.approx(
        4 * planned["resident"].parts_s["compute"]
    )


def test_an_update_that_begins_at_step_runs_beside_the_next_forward_pass_only() -> None:
    shape = TrainShape.decoder(layers=24, hidden=2048)
    n, d = shape.block_params, shape.dtype_bytes
    # a slow CPU takes no block: the GPU side moves every block's state, 12 bytes each way
    m = Machine("dram0", None, 400 * GiB, link=1e10, cpu_update=1e3, gpu_flops=1e14)
    waits = {o.name: o for o in fit(shape, m, 4096).options}
    for name, first_share in (("resident", 2 / 6), ("resident + checkpointing", 2 / 8)):
        o = waits[name]
        compute, update = o.parts_s["compute"], n * 12 / 1e10
        assert update > compute  # the update is what the step waits for
        assert o.parts_s["update_then_backward"] == pytest.approx(
            update + compute * (1 - first_share), rel=1e-3
        )
        assert o.step_s == o.parts_s["update_then_backward"] > o.parts_s["link"]
        assert o.bound.startswith("bound by update + backward"), o.bound
    # where the two sides slow each other (measured beside each other), the update does
    halved = Machine("dram0", None, 400 * GiB, link=1e10, cpu_update=1e3, gpu_flops=1e14,
                     shared=(1e3, 5e9))  # fmt: skip
    slower = {o.name: o for o in fit(shape, halved, 4096).options}["resident"].parts_s
    assert slower["update_then_backward"] == pytest.approx(
        waits["resident"].parts_s["update_then_backward"] + n * 12 / 1e10, rel=1e-3
    )
    assert slower["link"] == waits["resident"].parts_s["link"]  # the rest of the step: alone
    early = {o.name: o for o in fit(shape, m, 4096, update_in_backward=True).options}
    assert "update_then_backward" not in early["resident"].parts_s  # beside the backward pass
    assert early["resident"].step_s == pytest.approx(max(early["resident"].parts_s.values()))
    streamed = early["stream"].parts_s  # streamed, the update waits for step() all the same
    # (the next forward pass's weights coming in beside it), then the backward pass's
    # weights in and gradients home, where slower than its compute
    after = max(streamed["compute"] * 4 / 6, 2 * n * d / 1e10)
    assert streamed["update_then_backward"] == pytest.approx(
        n * (12 + d + d) / 1e10 + after, rel=1e-3
    )
    # begun in the last of 8 micro-batches' backward pass: beside that and the next
    # forward pass only, the other seven micro-batches after it
    eight = {o.name: o for o in fit(shape, m, 4096, accumulation=8,
                                    update_in_backward=True).options}["resident"]  # fmt: skip
    micro = eight.parts_s["compute"] / 8
    assert eight.parts_s["update_then_backward"] == pytest.approx(
        max(n * 12 / 1e10, micro) + 7 * micro, rel=1e-3
    )
    assert eight.step_s == eight.parts_s["update_then_backward"]
    with pytest.raises(InvalidRequestError, match="update_in_backward 1: give True or False"):
        pycxl.fit(shape, "dram0", None, tokens=4096, hbm_free="80G", update_in_backward=1)  # type: ignore[arg-type]


def test_state_goes_to_hbm_where_it_has_room_and_the_tier_takes_the_rest() -> None:
    shape = TrainShape.decoder(layers=22, hidden=2048, intermediate=5632)  # a 1.1B
    block = -(-shape.block_params // 22)
    rates = {"link": 50e9, "cpu_update": 2e9, "gpu_flops": 600e12}
    for weights in ("resident", "stream"):
        spare = {o.name: o for o in fit(shape, _machine(24, 100, **rates), 4096).options}
        o = spare[weights]
        held = o.hbm_blocks
        assert 0 < held < 22 and o.fits, o
        assert o.hbm["headroom"] == hbm_headroom(24 * GiB, o.hbm["activations_estimate"])
        one_block = block * 12 + (3 * block * 2 if weights == "stream" else 0)
        taken = sum(o.hbm.values())  # the headroom counted in
        assert taken <= 24 * GiB < taken + one_block
        assert o.hbm["optimizer_state"] == held * block * 12
        alone = fit(shape, Machine("dram0", None, 100 * GiB, **rates), 4096).options
        unheld = next(a for a in alone if a.name == weights)
        tier_alone = unheld.tier
        assert sum(o.tier.values()) == pytest.approx(sum(tier_alone.values()) * (22 - held) / 22,
                                                     rel=1e-6)  # fmt: skip
        # fewer blocks on the tier: less crosses the link, and the CPU updates fewer
        moved = o.parts_s["link"] + o.parts_s["update"]
        assert moved < unheld.parts_s["link"] + unheld.parts_s["update"]
    whole = fit(shape, _machine(139, 100), 4096)
    assert whole.chosen is not None and whole.chosen.hbm_blocks == 22
    all_held = next(o for o in whole.options if o.name == "stream")
    assert all_held.hbm_blocks == 22  # nothing streams: no ring, no gradients on their way
    assert all_held.hbm["block_weights"] == 22 * block * 2
    from pycxl.torch.offload.gpu_side import CHUNK_ELEMENTS

    assert all_held.hbm["update_buffers"] == min(block, CHUNK_ELEMENTS) * 4  # one fp32 piece
    assert "trains in HBM without offload" in whole.why, whole.why


def test_a_model_that_fits_in_neither_memory_alone_trains_in_both() -> None:
    planned = fit(LLAMA2_13B, _machine(139, 120), 4096)  # the GPU machine: H200, 125 GiB host
    c = planned.chosen
    assert c is not None and 0 < c.hbm_blocks < 40, planned.why
    assert sum(c.tier.values()) <= 120 * GiB < 16 * LLAMA2_13B.block_params
    assert sum(c.hbm.values()) <= 139 * GiB
    assert f"hbm_blocks={c.hbm_blocks}" in planned.why, planned.why


def test_what_fits_nowhere_says_how_much_more_and_where() -> None:
    planned = fit(LLAMA2_13B, _machine(40, 120), 4096)  # HBM too small to hold what the tier can't
    assert planned.chosen is None
    nearest = min(planned.options, key=lambda o: (o.short_hbm, o.short_tier))
    instead = f"or {nearest.tier_instead / GiB:.1f} GiB more free on dram0"
    assert "more HBM" in planned.why and instead in planned.why, planned.why
    # what it says the tier needs is enough: blocks come whole, so the figure is theirs
    more = fit(LLAMA2_13B, _machine(40, 120 + nearest.tier_instead / GiB + 0.01), 4096)
    assert more.chosen is not None, more.why
    no_hbm = fit(LLAMA2_13B, _machine(4, 400), 4096)
    assert "more HBM" in no_hbm.why and "fewer tokens" in no_hbm.why, no_hbm.why
    unknown = fit(LLAMA2_13B, Machine("dram0", None, 120 * GiB), 4096)
    short = 16 * LLAMA2_13B.block_params - 120 * GiB  # 12 bytes of state, 4 of pinned copies
    assert f"{short / GiB:.1f} GiB more free on dram0" in unknown.why, unknown.why


def test_bad_input_is_refused_by_name() -> None:
    shape = TrainShape.decoder(layers=2, hidden=64, vocab=100)
    with pytest.raises(InvalidRequestError, match="tokens must be at least 1, not 0"):
        fit(shape, _machine(1, 1), 0)
    with pytest.raises(InvalidRequestError, match="layers must be at most 4096"):
        TrainShape.decoder(layers=99_999_999, hidden=64)
    with pytest.raises(InvalidRequestError, match="link -1"):
        _machine(1, 1, link=-1.0)
    with pytest.raises(InvalidRequestError, match=r"give a torch\.nn\.Module"):
        pycxl.fit(None, "dram0", None, tokens=8, hbm_free="1G")
    with pytest.raises(InvalidRequestError, match="gpu_flops nan"):
        pycxl.fit(shape, "dram0", None, tokens=8, hbm_free="1G", gpu_flops=float("nan"))
    with pytest.raises(InvalidRequestError, match="seq 9"):
        fit(shape, _machine(1, 1), 8, seq=9)
    with pytest.raises(InvalidRequestError, match="fewer than the embeddings"):
        TrainShape.decoder(layers=2, hidden=64, vocab=100, params=1000)
    with pytest.raises(InvalidRequestError, match="layers must be at least 1, not 0"):
        TrainShape.decoder(layers=0, hidden=64)
    with pytest.raises(InvalidRequestError, match="give hbm_free"):
        pycxl.fit(shape, "dram0", None, tokens=8)


def test_fit_reads_the_tier_and_measures_the_cpu_update_here() -> None:
    planned = pycxl.fit(_llama(2), "dram0", None, tokens=64, hbm_free="8G")
    node = pycxl.snapshot(gpus=False).resolve("dram0").node
    assert planned.machine.hbm_free == 8 * GiB and planned.machine.tier == "dram0"
    assert 0 < planned.machine.tier_free <= pycxl.snapshot(gpus=False).tier(node).node.mem_total
    assert planned.machine.cpu_update is not None and planned.machine.cpu_update > 1e6
    assert planned.chosen is not None and planned.chosen.step_s is None  # no GPU rates given


def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycxl.cli.main", "plan-train", *args],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_plan_train_says_what_fits_and_exits_8_where_nothing_does() -> None:
    small = ["--params", "1.1B", "--layers", "22", "--hidden", "2048", "--tokens", "4096"]
    rates = ["--hbm", "16G", "--tier-free", "100G", "--link", "50", "--tflops", "600",
             "--cpu-update", "2"]  # fmt: skip
    fits = _plan(*small, *rates, "--update-in-backward")
    assert fits.returncode == 0, fits.stderr
    assert "fits: weights resident + checkpointing" in fits.stdout, fits.stdout
    chosen = next(line for line in fits.stdout.splitlines() if line.startswith("fits:"))
    # the update beside the backward pass: the step bound by compute, not waiting for it
    assert "(bound by compute: " in chosen and "update + backward" not in chosen, chosen
    clipped = _plan(*small, *rates)  # the update waits for step()
    assert "bound by update + backward: " in clipped.stdout, clipped.stdout
    assert "HBM      optimizer state" in fits.stdout, fits.stdout
    big = _plan("--params", "13B", "--layers", "40", "--hidden", "5120", "--tokens", "4096",
                "--hbm", "40G", "--tier-free", "120G", "--cpu-update", "2", "--json")  # fmt: skip
    assert big.returncode == 8 and "fits in no placement" in big.stderr, big.stderr
    doc = json.loads(big.stdout)
    assert doc["chosen"] is None and doc["placements"][0]["short_hbm"] > 0
    assert doc["placements"][0]["hbm_blocks"] > 0
    assert doc["machine"]["hbm_free"] == 40 * GiB and doc["machine"]["tier_free"] == 120 * GiB
    both = _plan(*small, "--hbm", "80G", "--gpu", "gpu0")
    assert both.returncode == 2 and "give one of them" in both.stderr, both.stderr


def test_plan_train_refuses_bad_input_and_a_missing_gpu_by_name() -> None:
    bad = _plan("--params", "13X", "--layers", "40", "--hidden", "5120", "--tokens", "4096")
    assert bad.returncode == 2 and "13X" in bad.stderr and "Traceback" not in bad.stderr
    if not pycxl.snapshot().gpus.devices:
        gone = _plan("--layers", "2", "--hidden", "64", "--tokens", "8")
        assert gone.returncode in (4, 5) and "--hbm" in gone.stderr, gone.stderr


def test_a_tier_short_of_room_names_the_blocks_hbm_would_have_to_hold() -> None:
    import re

    from pycxl.torch.offload.fit import check_tier_room

    room = {"streamed": True, "on_gpu": True, "free": 120 * GiB, "tier": "dram0"}
    with pytest.raises(InvalidRequestError, match=r"hbm_blocks=(\d+)") as e:
        check_tier_room(LLAMA2_13B, **room)
    n = int(re.search(r"hbm_blocks=(\d+)", str(e.value)).group(1))
    check_tier_room(LLAMA2_13B, hbm_blocks=n, **room)
    with pytest.raises(InvalidRequestError, match="more free memory on dram0"):
        check_tier_room(LLAMA2_13B, hbm_blocks=n - 1, **room)
    on_cpu = dict(room, on_gpu=False, free=1 * GiB)
    with pytest.raises(InvalidRequestError) as e:
        check_tier_room(LLAMA2_13B, **on_cpu)
    assert "hbm_blocks" not in str(e.value)  # no GPU: nothing to put in HBM


def test_where_only_checkpointing_fits_some_blocks_are_checkpointed() -> None:
    shape = TrainShape.decoder(layers=32, hidden=4096)
    rates = {"link": 50e9, "cpu_update": 2e9, "gpu_flops": 600e12}
    free = 56
    fits = [_option_of(shape, free, {}, k).fits for k in range(33)]
    assert not fits[0] and fits[32]
    fewest = fits.index(True)
    assert 0 < fewest < 32 and all(fits[fewest:])  # more checkpointed: fits still
    # rates unknown: the fewest that fit (the least recomputed)
    unknown = next(o for o in fit(shape, _machine(free, 400), 16384).options
                   if 0 < o.checkpointed_blocks < 32 and o.weights == "resident")  # fmt: skip
    assert unknown.checkpointed_blocks == fewest and unknown.fits
    assert unknown.name == f"resident + checkpointing of the first {fewest} blocks"
    # rates known: the fastest of those that fit
    planned = fit(shape, _machine(free, 400, **rates), 16384)
    partial = next(o for o in planned.options
                   if 0 < o.checkpointed_blocks < 32 and o.weights == "resident")  # fmt: skip
    steps = {k: _option_of(shape, free, rates, k).step_s for k in range(fewest, 32)}
    assert partial.step_s == min(steps.values())  # type: ignore[type-var]
    by_name = {o.name: o for o in planned.options}
    none, whole = by_name["resident"], by_name["resident + checkpointing"]
    assert whole.checkpointed_blocks == 32 and none.checkpointed_blocks == 0
    k = partial.checkpointed_blocks
    acts = partial.hbm["activations_estimate"]
    assert acts < none.hbm["activations_estimate"]
    # the last block checkpointed is recomputed at once: L - 1 keep less than L
    assert activation_bytes(shape, 16384, 31) < activation_bytes(shape, 16384, 32)
    assert step_peak(shape, 16384, k, stream=False)[1] == acts
    assert activation_bytes(shape, 16384, 1) < activation_bytes(shape, 16384, 0)
    # a checkpointed block's forward runs twice: k of 32 blocks cost k/32 of the extra
    extra = whole.parts_s["compute"] - none.parts_s["compute"]
    assert partial.parts_s["compute"] == pytest.approx(none.parts_s["compute"] + extra * k / 32)
    as_json = planned.to_dict()
    assert as_json["update_in_backward"] is False and as_json["lookahead"] == 1
    placements = as_json["placements"]
    assert placements[planned.options.index(partial)]["checkpointed_blocks"] == k
    assert placements[planned.options.index(whole)]["checkpointed_blocks"] == 32


def _option_of(shape: TrainShape, free: float, rates: dict[str, float], k: int) -> Any:
    from pycxl.torch.offload.fit import _option

    return _option(shape, _machine(free, 400, **rates), 16384, 16384, "resident", k, 1, 1)
