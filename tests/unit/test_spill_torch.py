"""The spill's PyTorch side that runs without a GPU: its statistics in the shape PyTorch's
own memory functions read (they format them here, with the real torch), and the optimizer
state the placement expects a step to make (real torch optimizers on the CPU)."""

from __future__ import annotations

import pytest

from pycxl.base._lib import compiled
from pycxl.base.errors import InvalidRequestError
from pycxl.torch import spill_handles, spill_placement, spill_stats

torch = pytest.importorskip("torch")
MiB = 1 << 20


def _figures() -> dict[str, tuple[int, int, int, int]]:
    f = dict.fromkeys(compiled.USE_FIGURES, (0, 0, 0, 0))
    f.update(bytes=(5 * MiB + 300, 9 * MiB, 20 * MiB, 15 * MiB - 300),
             bytes_small=(300, 300, 300, 0), bytes_large=(5 * MiB, 9 * MiB, 20 * MiB, 15 * MiB),
             count=(3, 4, 10, 7), count_small=(1, 1, 1, 0), count_large=(2, 3, 9, 7),
             hbm_bytes=(MiB + 300, 5 * MiB, 12 * MiB, 11 * MiB - 300),
             tier_bytes=(4 * MiB, 4 * MiB, 8 * MiB, 4 * MiB),
             tier_state_bytes=(4 * MiB, 4 * MiB, 4 * MiB, 0))  # fmt: skip
    f["tier_saved_bytes"] = (0, 2 * MiB, 3 * MiB, 3 * MiB)
    return f


def test_torchs_memory_functions_read_the_spills_statistics(monkeypatch) -> None:
    nested = spill_stats.nested_stats(_figures(), (8 * MiB, 16 * MiB, 20 * MiB, 12 * MiB), ooms=2)
    # torch.cuda.memory's functions, as they run in a spilling process (the patched entry
    # point answers for the device); here the CPU build reads the same dict
    monkeypatch.setattr(
        torch.cuda.memory, "memory_stats_as_nested_dict", lambda device=None: nested
    )
    assert torch.cuda.memory_allocated(0) == 5 * MiB + 300
    assert torch.cuda.max_memory_allocated(0) == 9 * MiB
    assert torch.cuda.memory_reserved(0) == 8 * MiB
    assert torch.cuda.max_memory_reserved(0) == 16 * MiB
    flat = torch.cuda.memory_stats(0)
    assert flat["tier_bytes.all.current"] == 4 * MiB and flat["hbm_bytes.all.peak"] == 5 * MiB
    assert flat["tier_optimizer_state_bytes.all.current"] == 4 * MiB and flat["num_ooms"] == 2
    assert flat["tier_saved_activation_bytes.all.peak"] == 2 * MiB
    summary = torch.cuda.memory_summary(0)
    assert "CUDA OOMs: 2" in summary and "Allocated memory" in summary
    assert "| Allocated memory      |   5120 KiB |   9216 KiB |  20480 KiB |" in summary, summary


def test_the_state_a_step_will_make_is_counted_once() -> None:
    w = torch.nn.Parameter(torch.zeros(1000))  # 4000 bytes
    b = torch.nn.Parameter(torch.zeros(10))
    for opt, per in ((torch.optim.AdamW([w, b]), 2), (torch.optim.Adam([w, b], amsgrad=True), 3),
                     (torch.optim.SGD([w, b], lr=0.1, momentum=0.9), 1)):  # fmt: skip
        assert spill_placement.state_bytes_to_make(opt) == (0, None)  # no gradients yet
        w.grad = torch.ones_like(w)
        made, where = spill_placement.state_bytes_to_make(opt)
        assert (made, where.type) == (per * 4000, "cpu")  # b has no gradient: nothing for it
        opt.step()
        assert spill_placement.state_bytes_to_make(opt) == (0, None)  # made already
        w.grad = None
    plain = torch.optim.SGD([w], lr=0.1)  # no momentum: no state
    w.grad = torch.ones_like(w)
    assert spill_placement.state_bytes_to_make(plain) == (0, None)


def test_state_goes_to_the_tier_only_where_the_step_would_not_fit() -> None:
    fits = spill_placement.state_belongs_on_tier
    assert not fits(peak=10 * MiB, state=4 * MiB, held_in_hbm=8 * MiB, room=7 * MiB, headroom=MiB)
    assert fits(peak=10 * MiB, state=4 * MiB, held_in_hbm=8 * MiB, room=6 * MiB, headroom=MiB + 1)


def test_the_saved_activation_budget_grows_by_what_a_step_spilled() -> None:
    from pycxl.torch import spill_saved

    # nothing spilled in this process (no GPU here): no rise, and the count is per device
    assert compiled.tier_spilled_rise(0) == 0
    with pytest.raises(InvalidRequestError, match="out of the spill's range"):
        compiled.tier_spilled_rise(1 << 20)
    assert spill_saved.next_budget(0, 8 * MiB) == 9 * MiB  # an eighth more
    assert spill_saved.next_budget(9 * MiB, 0) == 9 * MiB  # a step that fit keeps it


def test_every_optimizers_step_reaches_the_placement() -> None:
    """The hooks are torch's global ones: optimizers made before or after them, of any
    class, run them at each step (a CPU one only passes through), and remove() unhooks."""
    import torch.optim.optimizer as optimizer_module

    w = torch.nn.Parameter(torch.zeros(3))
    w.grad = torch.ones(3)
    before = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    placement = spill_placement.install(torch, slot=0, headroom=0)
    try:
        assert list(optimizer_module._global_optimizer_pre_hooks.values()) == [placement.pre]
        assert list(optimizer_module._global_optimizer_post_hooks.values()) == [placement.post]
        after = torch.optim.AdamW([w])
        before.step()
        after.step()
        assert placement.state_on_tier == placement.state_in_hbm == 0  # CPU state: not ours
        assert after.state[w]["exp_avg"].device.type == "cpu"
    finally:
        placement.remove()
    assert not optimizer_module._global_optimizer_pre_hooks
    assert not optimizer_module._global_optimizer_post_hooks


def test_a_tensor_changed_after_it_was_saved_is_refused_as_pytorch_refuses_it() -> None:
    """With hooks installed autograd leaves the saved-version check to them: what pack
    keeps where it is (here every CPU tensor) must still be refused if changed."""
    from pycxl.torch.spill_saved import SavedOffload

    saved = SavedOffload(torch, slot=0)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        a = torch.ones(4, requires_grad=True) * 2  # a non-leaf, as activations are
        b = (a * a).sum()
        b.backward(retain_graph=True)
        ok = torch.autograd.grad((a * a).sum(), a)[0]
        c = (a * a).sum()
        with torch.no_grad():
            a.mul_(3)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            c.backward()
    assert torch.equal(ok, torch.full((4,), 4.0))


def test_a_graph_dropped_without_a_backward_pass_frees_what_it_saved() -> None:
    """exp saves its own output: kept as it is, the saved tensor would hold the grad_fn
    that holds it, a cycle the collector cannot see (the graph would never be freed)."""
    import gc
    import weakref

    from pycxl.torch.spill_saved import SavedOffload

    saved = SavedOffload(torch, slot=0)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        a = torch.ones(4, requires_grad=True)
        out = (a * 2).exp()
        dropped = weakref.ref(out)
        del out
        gc.collect()
        assert dropped() is None, "the graph outlived its last reference"
        y = (a * 2).exp()  # and one used: the gradient as without the hooks
        y.sum().backward()
    assert torch.allclose(a.grad, 2 * torch.full((4,), 2.0).exp())


def test_the_hooks_wait_for_the_scripts_own_to_close_and_outlive_later_ones() -> None:
    """A script's own ``with saved_tensors_hooks`` pops the top of torch's stack at its
    exit: ours are installed only where none of its own is open, and then stay installed
    through its later ones."""
    from torch._C._autograd import (
        _pop_saved_tensors_default_hooks as pop,
        _top_saved_tensors_default_hooks as top,
    )

    from pycxl.torch.spill_saved import SavedOffload

    saved = SavedOffload(torch, slot=0)
    assert top(False) is None
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert not saved.install_hooks()
    assert top(False) is None
    try:
        assert saved.install_hooks() and saved.install_hooks()  # once
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            pass
        assert top(False) == (saved.pack, saved.unpack)
    finally:
        pop()
    assert top(False) is None


def test_the_backward_handle_hook_waits_for_a_cuda_call_with_gradients() -> None:
    """Module calls on the CPU, or without gradients, leave the hook in place (no
    backward pass of a CUDA device follows them); remove() takes it out of torch's
    global forward pre-hooks and optimizer step hooks."""
    from torch.nn.modules import module as nn_module

    before = len(nn_module._global_forward_pre_hooks)
    hook = spill_handles.install(torch)
    try:
        layer = torch.nn.Linear(4, 4)
        layer(torch.ones(2, 4)).sum().backward()
        with torch.no_grad():
            layer(torch.ones(2, 4))
        assert hook.installed and len(nn_module._global_forward_pre_hooks) == before + 1
    finally:
        hook.remove()
    assert not hook.installed and len(nn_module._global_forward_pre_hooks) == before


def _two_layers() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))


@pytest.mark.parametrize(
    "first_call", ["plain", "checkpoint", "checkpoint_sequential", "default_device"]
)
def test_the_warm_up_runs_at_the_first_call_with_gradients_and_changes_no_gradient(
    first_call: str,
) -> None:
    """The hook, serving the CPU's backward pass here as it serves a CUDA device's: its
    small backward pass runs once, at the first module call with gradients, even inside a
    non-reentrant checkpoint (whose saved-tensor hooks would otherwise take it for the
    checkpointed function's and recompute that), and the script's gradients are the ones
    it gets without the hook."""
    from torch.utils.checkpoint import checkpoint, checkpoint_sequential

    def grads(hooked: bool) -> list[torch.Tensor]:
        model = _two_layers()
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
        hook = spill_handles.install(torch, device_type="cpu") if hooked else None
        try:
            if first_call == "checkpoint":
                y = checkpoint(model, x, use_reentrant=False)
            elif first_call == "checkpoint_sequential":
                y = checkpoint_sequential(model, 2, x, use_reentrant=False)
            elif first_call == "default_device":  # a function mode the hook lets pass
                with torch.device("cpu"):
                    y = model(x)
            else:
                y = model(x)
            if hook is not None:
                assert not hook.installed  # fired, and gone: later calls pay nothing
            y.square().sum().backward()
        finally:
            if hook is not None:
                hook.remove()
        return [p.grad for p in model.parameters()]

    for a, b in zip(grads(hooked=True), grads(hooked=False), strict=True):
        assert torch.equal(a, b)


def test_the_first_optimizer_step_ends_the_hook_and_a_dispatch_mode_defers_it() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    hook = spill_handles.install(torch, device_type="cpu")
    try:
        layer = torch.nn.Linear(4, 4)
        with FlopCounterMode(display=False) as counter:  # it would count the warm-up's
            layer(torch.ones(2, 4))
        assert hook.installed and counter.get_total_flops() == 2 * 2 * 4 * 4
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        with torch.no_grad():
            layer(torch.ones(2, 4))
        opt.step()
        assert not hook.installed
    finally:
        hook.remove()


def test_a_refusal_in_the_summary_says_what_the_node_still_has() -> None:
    from pycxl.torch.spill_report import SpillReport

    GiB = 1 << 30
    r = SpillReport(device=0, tier="dram0", node=0, hbm_peak=70 * GiB, tier_now=GiB,
                    tier_peak=100 * GiB, state_on_tier_now=0, state_on_tier_peak=0,
                    saved_on_tier_peak=0, spilled_peak=100 * GiB, spilled=12, refused=1,
                    misplaced_pages=0, last_refusal="cuMemCreate of 4294967296 bytes on host "
                    "node 0: CUDA error 2", steps=0, saved_sent=0, node_available=GiB)  # fmt: skip
    assert r.lines()[-1] == (
        "  1 refused by dram0 too: cuMemCreate of 4294967296 bytes on host node 0: CUDA "
        "error 2; node 0 has 1.00 GiB available now"
    )


def test_the_first_step_ends_the_hook_beside_a_later_global_step_hook() -> None:
    """The step hook does not unhook itself while the step iterates over the global step
    hooks (an OrderedDict: one registered after it would find it mutated)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    hook = spill_handles.install(torch)  # CUDA's: CPU calls never fire it
    seen: list[int] = []
    later = register_optimizer_step_post_hook(lambda *_: seen.append(1))
    try:
        layer = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        for _ in range(2):
            layer(torch.ones(2, 4)).sum().backward()
            opt.step()
        assert seen == [1, 1] and not hook.installed
    finally:
        later.remove()
        hook.remove()


def test_a_model_compiled_in_place_is_not_compiled_again_when_the_hook_ends() -> None:
    """Dynamo traces the global hook into the model's graph and guards on the hooks it
    saw: the first step ends the hook without taking it out, so no step recompiles."""
    import torch._dynamo

    class TwoCalls(torch.nn.Module):  # a forward that calls its submodules itself
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)))

    torch._dynamo.reset()
    hook = spill_handles.install(torch, device_type="cpu")
    try:
        model = TwoCalls()
        model.compile(backend="eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch._dynamo.config.patch(error_on_recompile=True):
            for _ in range(3):
                model(torch.ones(2, 8)).square().sum().backward()
                opt.step()
        assert hook.traced and not hook.installed
    finally:
        hook.remove()
        torch._dynamo.reset()
