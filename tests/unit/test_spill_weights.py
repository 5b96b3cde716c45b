"""Spilled weights read through HBM by copy, driven on the CPU through the streamer's
seams: a real torch model, some of whose parameters are marked as on the tier (their
storages are the ones the seam's ``to_tier`` made), and byte buffers standing for HBM.
What each module's call read, and what its parameters are after it, is checked."""

from __future__ import annotations

import weakref

import pytest

from pycxl.torch import spill_weights

torch = pytest.importorskip("torch")
WIDTH = 512  # a 512 x 512 fp32 Linear: 1 MiB of weight, streamed


class FakeTier:
    """Which storages are on the 'tier', HBM's room, and what the seams did."""

    def __init__(self, room: int) -> None:
        self.storages: list[object] = []  # the tier's tensors, kept alive
        self.room = room
        self.buffers: list[object] = []

    def owns(self, t: object) -> bool:
        ptr = t.untyped_storage().data_ptr()
        return any(s.untyped_storage().data_ptr() == ptr for s in self.storages)

    def to_tier(self, t: object) -> object:
        c = t.clone()
        self.storages.append(c)
        self.room += t.numel() * t.element_size()  # its HBM given back
        return c

    def in_hbm(self, device: object, n: int) -> object | None:
        if n > self.room:
            return None
        self.room -= n
        b = torch.empty(n, dtype=torch.uint8)
        self.buffers.append(weakref.ref(b))
        weakref.finalize(b, self._give_back, n)  # its room back once dropped, as HBM's
        return b

    def _give_back(self, n: int) -> None:
        self.room += n

    def in_ring(self, t: object) -> bool:
        ptr = t.untyped_storage().data_ptr()
        return any(b() is not None and b().untyped_storage().data_ptr() == ptr
                   for b in self.buffers)  # fmt: skip

    def to_hbm(self, t: object) -> object | None:
        n = t.numel() * t.element_size()
        if n > self.room:
            return None
        self.room -= n
        return t.clone()

    def seams(self, trained: bool = False) -> spill_weights.Seams:
        return spill_weights.Seams(on_tier=self.owns, to_tier=self.to_tier,
                                   hbm_room=lambda device: self.room, in_hbm=self.in_hbm,
                                   to_hbm=self.to_hbm, trained=lambda: trained)  # fmt: skip


def _model(tier: FakeTier, layers: int = 6, on_tier_from: int = 3) -> object:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)]).eval()
    for layer in list(model)[on_tier_from:]:
        for p in layer.parameters():
            p.data = tier.to_tier(p.data)
    tier.room = 0
    return model


@pytest.fixture
def streaming():
    made = []

    def install(tier: FakeTier, trained: bool = False) -> spill_weights.WeightStreamer:
        s = spill_weights.install(torch, tier.seams(trained), device_type="cpu")
        made.append(s)
        return s

    yield install
    for s in made:
        s.remove()


def _same_each_pass(model: object, x: object, want: object, passes: int = 3) -> None:
    """Passes without gradients, each giving ``want``."""
    with torch.no_grad():
        for _ in range(passes):
            assert torch.equal(model(x), want)


def _spilled_and_streamed(
    streaming, tier: FakeTier, model: object, spilled: list[object], x: object, room: int = 1 << 30
) -> spill_weights.WeightStreamer:
    """``spilled``'s parameters put on the tier, HBM given ``room``, the streamer
    installed, and passes that each give the plain model's output."""
    for module in spilled:
        for p in module.parameters():
            p.data = tier.to_tier(p.data)
    tier.room = room
    with torch.no_grad():
        want = model(x)
    streamer = streaming(tier)
    _same_each_pass(model, x, want)
    return streamer


def _where(t: object, tier: FakeTier) -> str:
    return "ring" if tier.in_ring(t) else "tier" if tier.owns(t) else "hbm"


def _reads(modules: object, tier: FakeTier) -> list[str]:
    """Where each of ``modules``' weight is as its call begins: 'tier', 'ring' or 'hbm'."""
    seen: list[str] = []

    def where(module: object, args: object) -> None:
        seen.append(_where(module.weight, tier))

    for module in modules:
        module.register_forward_pre_hook(where)
    return seen


def test_the_tier_comes_to_hold_the_first_modules_called_read_from_the_ring(streaming):
    """The last three layers spilled (as HBM filled while the model was made): the plan
    exchanges them for the first three, byte for byte, so that a pass begins with the
    link's copies; from the next pass on those are read from the ring, and after each
    call the parameters are their own again."""
    tier = FakeTier(room=0)
    model = _model(tier)
    x = torch.randn(3, WIDTH)
    with torch.no_grad():
        want = model(x)
    tier.room = 4 * (WIDTH * WIDTH * 4 + 4096)  # room for the ring: nothing need move
    streamer = streaming(tier)
    seen = _reads(model, tier)
    with torch.no_grad():
        for k in range(4):
            seen.clear()
            assert torch.equal(model(x), want)
            expected = ["hbm"] * 3 + ["tier"] * 3 if k == 0 else ["ring"] * 3 + ["hbm"] * 3
            assert seen == expected, (k, seen)
            assert [tier.owns(layer.weight) for layer in model] == [True] * 3 + [False] * 3
    assert streamer.state == "streaming" and streamer.moved_bytes == 0
    assert streamer.exchanged_bytes == 3 * (WIDTH + 1) * WIDTH * 4


def test_a_tier_that_holds_the_first_modules_called_already_is_left_as_it_is(streaming):
    tier = FakeTier(room=0)
    model = _model(tier, layers=6, on_tier_from=0)
    for layer in list(model)[3:]:
        for p in layer.parameters():
            p.data = p.data.clone()  # back in 'HBM'
    tier.room = 1 << 30
    x = torch.randn(3, WIDTH)
    with torch.no_grad():
        want = model(x)
    streamer = streaming(tier)
    _same_each_pass(model, x, want)
    assert streamer.state == "streaming" and streamer.exchanged_bytes == 0
    assert [tier.owns(layer.weight) for layer in model] == [True] * 3 + [False] * 3


def test_without_room_the_hbm_weights_called_next_move_to_the_tier_and_are_streamed(streaming):
    tier = FakeTier(room=0)
    model = _model(tier, layers=9, on_tier_from=6)
    x = torch.randn(3, WIDTH)
    with torch.no_grad():
        want = model(x)
    streamer = streaming(tier)
    seen = _reads(model, tier)
    with torch.inference_mode():  # generate's own mode; the ring and moves are plain tensors
        for _ in range(3):
            seen.clear()
            assert torch.equal(model(x), want)
    # the tier's three were exchanged for the first three called; then the ring (three
    # layers' worth) took the room of the three called next
    assert streamer.state == "streaming" and streamer.moved_bytes == 3 * (WIDTH + 1) * WIDTH * 4
    assert [tier.owns(layer.weight) for layer in model] == [True] * 6 + [False] * 3
    assert seen == ["ring"] * 6 + ["hbm"] * 3
    assert not any(layer.weight.is_inference() for layer in model)
    # a forward pass with gradients (training begins): the weights moved for the ring go
    # back; the exchange stays (the tier holds as many bytes as before)
    out = model(x)
    out.sum().backward()
    assert streamer.state == "off"
    assert [tier.owns(layer.weight) for layer in model] == [True] * 3 + [False] * 6
    assert torch.equal(out.detach(), want)


def test_a_module_called_out_of_order_reads_its_own_copy(streaming):
    tier = FakeTier(room=0)
    model = _model(tier, layers=5, on_tier_from=0)
    x = torch.randn(2, WIDTH)
    tier.room = 4 * (WIDTH * WIDTH * 4 + 4096)
    streaming(tier)
    with torch.no_grad():
        model(x)
        model(x)  # learnt: streaming from here
        a = model[3](model[0](x))  # skips 1 and 2: the ring starts again at 3
        b = model[4](model[2](x))  # and again at 2 (behind the last read)
        full = model(x)
    streaming_off = [layer.weight.detach().clone() for layer in model]
    ref = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(5)])
    for layer, w in zip(ref, streaming_off, strict=True):
        layer.weight.data = w
    for layer, src in zip(ref, model, strict=True):
        layer.bias.data = src.bias.detach().clone()
    with torch.no_grad():
        assert torch.equal(a, ref[3](ref[0](x)))
        assert torch.equal(b, ref[4](ref[2](x)))
        assert torch.equal(full, ref(x))


def test_a_process_that_trained_streams_nothing_and_moves_nothing(streaming):
    tier = FakeTier(room=0)
    model = _model(tier)
    streamer = streaming(tier, trained=True)
    seen = _reads(model, tier)
    with torch.no_grad():
        model(torch.randn(1, WIDTH))
        model(torch.randn(1, WIDTH))
    assert streamer.state == "off" and streamer.moved_bytes == 0
    assert seen[6:] == ["hbm"] * 3 + ["tier"] * 3


def test_a_forward_pass_with_gradients_turns_it_off_and_unhooks_it(streaming):
    """Training reads its weights in place: the first forward pass with gradients ends
    the streamer before it learnt anything, and its hooks leave at the next call, so a
    training step pays nothing for it; later passes without gradients read in place."""
    tier = FakeTier(room=1 << 30)
    model = _model(tier)
    tier.room = 1 << 30
    streamer = streaming(tier)
    seen = _reads(model, tier)
    for _ in range(3):
        model(torch.randn(1, WIDTH)).sum().backward()
    assert streamer.state == "off" and streamer.handles == []
    assert seen[-3:] == ["tier"] * 3
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(1, WIDTH))
    assert streamer.state == "off" and seen[-3:] == ["tier"] * 3 and tier.room == 1 << 30


def test_passes_that_read_nothing_on_the_tier_turn_it_off(streaming):
    """Inference that spilled no weight: after QUIET_PASSES passes that read none on the
    tier the streamer is off and unhooked (a pass no longer costs it a scan)."""
    tier = FakeTier(room=1 << 30)
    model = _model(tier, on_tier_from=6)  # nothing on the tier
    streamer = streaming(tier)
    with torch.no_grad():
        for _ in range(spill_weights.QUIET_PASSES - 1):
            model(torch.randn(1, WIDTH))
        assert streamer.state == "learning"  # a call outside the model may come first
        model(torch.randn(1, WIDTH))
        assert streamer.state == "off"
        model(torch.randn(1, WIDTH))
    assert streamer.handles == []


def test_a_training_step_with_reentrant_checkpointing_streams_nothing(streaming):
    """Reentrant activation checkpointing runs each segment without gradients inside a
    forward pass with them: the outer call ends the streamer before a segment could
    plan a ring."""
    from torch.utils.checkpoint import checkpoint

    tier = FakeTier(room=0)
    model = _model(tier)
    tier.room = 1 << 30
    streamer = streaming(tier)
    seen = _reads(model, tier)
    rings = []
    in_hbm = streamer.seams.in_hbm
    streamer.seams.in_hbm = lambda device, n: rings.append(n) or in_hbm(device, n)

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=True)

    outer = Outer()
    for _ in range(3):
        outer(torch.randn(1, WIDTH, requires_grad=True)).sum().backward()
    assert streamer.state == "off" and rings == [] and streamer.moved_bytes == 0
    assert "ring" not in seen


def test_an_embedding_table_moves_first_and_is_read_in_place(streaming):
    tier = FakeTier(room=0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(2048, WIDTH),  # 4 MiB, in HBM
        *[torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)],
    ).eval()
    for layer in list(model)[3:]:
        for p in layer.parameters():
            p.data = tier.to_tier(p.data)
    tier.room = 0
    ids = torch.tensor([[1, 5, 7]])
    with torch.no_grad():
        want = model(ids)
    streamer = streaming(tier)
    _same_each_pass(model, ids, want)
    # the table's 4 MiB made room for the ring (3 Linears' worth): no Linear moved for
    # it; the two Linears on the tier were exchanged for the first two called
    assert streamer.moved_bytes == 2048 * WIDTH * 4 and tier.owns(model[0].weight)
    assert [tier.owns(layer.weight) for layer in list(model)[1:]] == [True] * 2 + [False] * 2
    assert streamer.state == "streaming" and len(streamer._order) == 2


class Nested(torch.nn.Module):
    """A module with a weight of its own that calls a child with its own."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(WIDTH, WIDTH))
        self.child = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: object) -> object:
        return self.child(x) @ self.weight


def test_a_parent_whose_children_stream_reads_its_own_weight_in_place(streaming):
    tier = FakeTier(room=0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Nested() for _ in range(4)]).eval()
    for p in model.parameters():
        p.data = tier.to_tier(p.data)
    tier.room = 1 << 30
    x = torch.randn(2, WIDTH)
    with torch.no_grad():
        want = model(x)
    streamer = streaming(tier)
    with torch.no_grad():
        for _ in range(4):
            assert torch.equal(model(x), want)
    assert streamer.state == "streaming"
    assert sorted(streamer._index) == sorted(id(m.child) for m in model)


def test_a_weight_changed_between_passes_is_copied_again(streaming):
    tier = FakeTier(room=0)
    model = _model(tier, layers=4, on_tier_from=0)
    tier.room = 1 << 30
    x = torch.randn(2, WIDTH)
    streaming(tier)
    with torch.no_grad():
        model(x)
        model(x)  # streaming; the next pass's first copies are made at its end
        model[0].weight.mul_(0.5)
        model[1].weight.data = model[1].weight.data.clone()  # a new storage
        got = model(x)
    reference = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)])
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(got, reference(x))


def test_a_ring_that_would_outgrow_hbm_puts_back_what_moved_and_reads_in_place(streaming):
    tier = FakeTier(room=0)
    torch.manual_seed(0)
    # three 1 MiB Linears on the tier, then a 4 MiB one in HBM, called last: moving it
    # makes 4 MiB of room but needs a ring of three of its size
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(3)],
                                torch.nn.Linear(WIDTH, 4 * WIDTH)).eval()  # fmt: skip
    for layer in list(model)[:3]:
        for p in layer.parameters():
            p.data = tier.to_tier(p.data)
    tier.room = 0
    x = torch.randn(2, WIDTH)
    with torch.no_grad():
        want = model(x)
    streamer = streaming(tier)
    with torch.inference_mode():
        for _ in range(3):
            assert torch.equal(model(x), want)
    assert streamer.state == "off" and not tier.owns(model[3].weight)


def test_a_head_tied_to_the_embedding_is_streamed_and_the_table_read_in_place(streaming):
    tier = FakeTier(room=0)
    torch.manual_seed(0)
    emb = torch.nn.Embedding(2048, WIDTH)
    head = torch.nn.Linear(WIDTH, 2048, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, torch.nn.Linear(WIDTH, WIDTH), head).eval()
    emb.weight.data = tier.to_tier(emb.weight.data)
    tier.room = 1 << 30
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        want = model(ids)
    streamer = streaming(tier)
    _same_each_pass(model, ids, want)
    assert streamer.state == "streaming" and list(streamer._index) == [id(head)]


def test_a_call_outside_the_model_first_does_not_keep_it_from_streaming(streaming):
    """A module called once without gradients before the model (a helper, made at set-up)
    is a pass of its own: it read nothing on the tier, so the model's next pass is the
    one learnt."""
    tier = FakeTier(room=0)
    model = _model(tier)
    x = torch.randn(3, WIDTH)
    with torch.no_grad():
        want = model(x)
    tier.room = 1 << 30
    streamer = streaming(tier)
    seen = _reads(model, tier)
    with torch.no_grad():
        torch.nn.Linear(4, 4)(torch.ones(1, 4))  # gone after this line
        _same_each_pass(model, x, want)
    assert streamer.state == "streaming" and seen[-6:] == ["ring"] * 3 + ["hbm"] * 3


def _hf_model(kind: str) -> object:
    """A Hugging Face causal LM of ``kind`` (two architectures: Llama's Linears, GPT-2's
    Conv1Ds with biases, made non-zero: they stay in HBM while their weights spill, and
    are copied with them), small, with modules of 1 MiB and more."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1024,
                                       num_hidden_layers=4, num_attention_heads=8,
                                       num_key_value_heads=2)  # fmt: skip
        return transformers.LlamaForCausalLM(cfg).eval()
    cfg = transformers.GPT2Config(vocab_size=1000, n_embd=512, n_layer=4, n_head=8,
                                  bos_token_id=999, eos_token_id=999)  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # its biases start at zero: give them values the copy must carry
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.02)
    return model


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_hugging_face_generate_streams_the_spilled_layers_to_the_same_tokens_and_logits(
    streaming, kind
):
    model = _hf_model(kind)
    prompt = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(1))

    def generate() -> tuple[list[int], object]:
        """The tokens and each token's logits (an untrained model's greedy tokens hardly
        move with its weights: the logits do)."""
        out = model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                             pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True)  # fmt: skip
        return out.sequences[0, 12:].tolist(), torch.stack(out.logits)

    want_tokens, want_logits = generate()
    tier = FakeTier(room=0)
    layers = list(model.model.layers if kind == "llama" else model.transformer.h)
    for layer in layers[2:]:  # the last half spilled, as HBM filled while loading; as
        for p in layer.parameters():  # the spill places them, the small ones stay
            if p.numel() * p.element_size() >= spill_weights.SMALLEST:
                p.data = tier.to_tier(p.data)
    tier.room = 1 << 30

    def big(half: list[object]) -> list[object]:
        return [m for layer in half for m in layer.modules()
                if hasattr(m, "weight") and m.weight.dim() == 2
                and m.weight.numel() * 4 >= spill_weights.SMALLEST]  # fmt: skip

    first, last = big(layers[:2]), big(layers[2:])
    reads: list[tuple[object, str]] = []
    for m in first + last:
        m.register_forward_pre_hook(lambda m, args: reads.append((m, _where(m.weight, tier))))
    streamer = streaming(tier)
    tokens, logits = generate()  # the first pass is learnt, the rest stream
    assert tokens == want_tokens and torch.equal(logits, want_logits)
    assert streamer.state == "streaming" and streamer.exchanged_bytes > 0
    # the first pass read the last half on the tier; the plan exchanged it for the first
    # half, which every later pass read from the ring, the last half from HBM
    n = len(first + last)
    assert {where for m, where in reads[:n] if m in last} == {"tier"}
    later = reads[n:]
    assert later and {where for m, where in later if m in first} == {"ring"}
    assert {where for m, where in later if m in last} == {"hbm"}
    assert all(tier.owns(m.weight) for m in first) and not any(tier.owns(m.weight) for m in last)


def test_a_module_too_large_for_what_may_leave_hbm_stays_on_the_tier(streaming):
    """A 3 MB Linear spilled, called last, after four of 1 MiB in HBM: the first called
    that fit in its bytes (two) cannot make its room, so nothing is exchanged."""
    tier = FakeTier(room=0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)],
                                torch.nn.Linear(WIDTH, 1500)).eval()  # fmt: skip
    streamer = _spilled_and_streamed(streaming, tier, model, [model[4]], torch.randn(2, WIDTH))
    assert streamer.state == "streaming" and streamer.exchanged_bytes == 0
    assert [tier.owns(layer.weight) for layer in model] == [False] * 4 + [True]


def test_a_module_called_several_times_a_pass_stays_in_hbm(streaming):
    """A shared Linear called three times first (moved to the tier, each call would copy
    it), HBM without room: the exchange takes the modules called once after it, and so
    does the room for the ring."""
    tier = FakeTier(room=0)
    torch.manual_seed(0)
    shared = torch.nn.Linear(WIDTH, WIDTH)
    layers = [torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)]

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared, self.layers = shared, torch.nn.ModuleList(layers)

        def forward(self, x: object) -> object:
            for _ in range(3):
                x = self.shared(x)
            for layer in self.layers:
                x = layer(x)
            return x

    model = Model().eval()
    streamer = _spilled_and_streamed(streaming, tier, model, [layers[3]], torch.randn(2, WIDTH),
                                     room=0)  # fmt: skip
    assert streamer.state == "streaming" and not tier.owns(shared.weight)
    assert [tier.owns(layer.weight) for layer in layers] == [True] * 4
    assert streamer.exchanged_bytes == (WIDTH + 1) * WIDTH * 4


def _wide_last(tier: FakeTier) -> object:
    """Four 1 MiB Linears, then a 2 MiB one: its room takes two of the others."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)],
                               torch.nn.Linear(WIDTH, 2 * WIDTH)).eval()  # fmt: skip


def test_a_plan_the_tier_cannot_take_is_given_up_and_weights_read_in_place(streaming):
    """The tier fills with the second module of an exchange: the first goes back to HBM,
    the streamer is off, no error reaches the model's caller."""
    tier = FakeTier(room=0)
    model = _wide_last(tier)
    full = tier.to_tier

    def to_full_tier(t: object) -> object:
        if len(tier.storages) >= 4:  # the wide one spilled, then one module more
            raise torch.OutOfMemoryError("the tier is full")
        return full(t)

    tier.to_tier = to_full_tier
    streamer = _spilled_and_streamed(streaming, tier, model, [model[4]], torch.randn(3, WIDTH))
    assert streamer.state == "off" and streamer.exchanged_bytes == 0
    assert [tier.owns(layer.weight) for layer in model] == [False] * 4 + [True]


def test_an_exchange_whose_module_cannot_come_back_returns_what_left(streaming):
    """HBM refuses the wide module's bias, after its weight (the room was not there
    after all): the weight goes back to the tier, the two that left for it come back,
    and the wide one is streamed from where it was."""
    tier = FakeTier(room=0)
    model = _wide_last(tier)
    takes = tier.to_hbm
    tier.to_hbm = lambda t: None if t.numel() == 2 * WIDTH else takes(t)
    streamer = _spilled_and_streamed(streaming, tier, model, [model[4]], torch.randn(3, WIDTH))
    assert streamer.state == "streaming" and streamer.exchanged_bytes == 0
    assert [tier.owns(layer.weight) for layer in model] == [False] * 4 + [True]


@pytest.mark.parametrize(("value", "on"), [(None, True), ("", True), (" ", True), ("0", False),
                                           (" 0 ", False), ("1", True)])  # fmt: skip
def test_the_streamer_is_on_unless_its_variable_says_0(monkeypatch, value, on) -> None:
    """Spilled weights are streamed by default (what spill_to asks); PYCXL_SPILL_STREAM_
    WEIGHTS=0 reads them in place; the spill log stays off unless asked for."""
    from pycxl.torch import tier

    monkeypatch.delenv(tier.STREAM_WEIGHTS_ENV, raising=False)
    monkeypatch.delenv(tier.SPILL_LOG_ENV, raising=False)
    if value is not None:
        monkeypatch.setenv(tier.STREAM_WEIGHTS_ENV, value)
    assert tier.streams_weights() is on
    assert tier._switched_on(tier.SPILL_LOG_ENV) is False
