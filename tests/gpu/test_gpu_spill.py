"""The spill as a PyTorch program sees it, on the GPU machine (dram0 stands for the
tier): PyTorch's memory statistics answer under it; an optimizer whose state would not
fit beside the step's peak gets its state on the tier (not its activations), with the
losses of a run that had the room; and ``pycxl spill`` ends with its summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.gpu import dram0_node

pytestmark = pytest.mark.gpu
MiB = 1 << 20
GiB = 1 << 30


def _child(code: str, *args: str) -> dict:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                       capture_output=True, text=True, timeout=300, check=False,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


STATS = """
import json, torch, pycxl
pool = pycxl.spill_to("dram0")
free, _ = torch.cuda.mem_get_info()
blocker = torch.empty(free - 3 * (1 << 30), dtype=torch.uint8, device="cuda")
xs = [torch.ones(1 << 28, device="cuda") for _ in range(4)]  # 1 GiB each: the last spill
small = torch.ones(1000, device="cuda")
m = torch.cuda.memory_stats()
out = {"allocated": torch.cuda.memory_allocated(), "peak": torch.cuda.max_memory_allocated(),
       "reserved": torch.cuda.memory_reserved(), "tier": m["tier_bytes.all.current"],
       "hbm": m["hbm_bytes.all.current"], "count": m["allocation.all.current"],
       "small": m["allocated_bytes.small_pool.current"], "summary": torch.cuda.memory_summary()}
del xs
out["after_free"] = torch.cuda.memory_allocated()
out["peak_kept"] = torch.cuda.max_memory_allocated()
torch.cuda.reset_peak_memory_stats()
out["peak_reset"] = torch.cuda.max_memory_allocated()
out["spilled"] = pool.stats().gpu_refusals
print(json.dumps(out))
"""


def test_pytorchs_memory_statistics_answer_under_the_spill() -> None:
    out = _child(STATS)
    blocker = out["hbm"] + out["tier"] - 4 * GiB - 4000
    assert out["spilled"] >= 1 and out["tier"] >= GiB, out
    assert out["allocated"] == out["hbm"] + out["tier"]
    assert out["peak"] == out["allocated"] and out["reserved"] >= out["allocated"]
    assert out["count"] == 6 and out["small"] == 4000
    assert "PyTorch CUDA memory summary" in out["summary"]
    assert out["after_free"] == blocker + 4000 and out["peak_kept"] == out["peak"]
    assert out["peak_reset"] == out["after_free"]


TRAIN = """
import json, sys, torch, pycxl
from pycxl.numa import pages
pressure = sys.argv[1] == "pressure"
pool = pycxl.spill_to("dram0")
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(16)]).cuda()  # 1 GiB
opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
if pressure:  # what is left: the step's gradients (1 GiB) fit, 2 GiB of state more do not
    free, _ = torch.cuda.mem_get_info()
    blocker = torch.empty(free - 3 * (1 << 30), dtype=torch.uint8, device="cuda")
x = torch.randn(64, 4096, device="cuda")
losses = []
for _ in range(4):
    loss = model(x).square().mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
st = opt.state[model[0].weight]["exp_avg"]
m = torch.cuda.memory_stats()
print(json.dumps({"losses": losses, "state_pages": pages.span_by_node(st.data_ptr(), 1 << 20),
                  "state_on_tier": m["tier_optimizer_state_bytes.all.current"],
                  "spilled": pool.stats().gpu_refusals}))
"""


def test_optimizer_state_goes_to_the_tier_where_the_step_would_not_fit() -> None:
    roomy = _child(TRAIN, "roomy")
    tight = _child(TRAIN, "pressure")
    node, state = dram0_node(), 2 * 16 * (4096 * 4096 + 4096) * 4
    assert tight["state_pages"] == {str(node): 256}, tight
    # the state and its step counts (4 bytes a parameter); nothing else spilled
    assert state <= tight["state_on_tier"] < state + MiB and tight["spilled"] == 0, tight
    assert roomy["state_on_tier"] == 0 and str(node) not in roomy["state_pages"], roomy
    assert tight["losses"] == roomy["losses"]  # the same fused kernel over the same bytes


def test_pycxl_spill_ends_with_its_summary(tmp_path) -> None:
    script = tmp_path / "train.py"
    unchanged = TRAIN.replace('pool = pycxl.spill_to("dram0")\n', "")
    script.write_text(textwrap.dedent(unchanged.replace("pool.stats().gpu_refusals", "0")))
    p = subprocess.run(["pycxl", "spill", "dram0", str(script), "pressure"], capture_output=True,
                       text=True, timeout=300, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "pycxl spill: cuda:0: HBM peak" in p.stderr, p.stderr[-2000:]
    assert "optimizer state 2.00 GiB at peak" in p.stderr, p.stderr[-2000:]
    assert "other (spilled) 0 B;" in p.stderr, p.stderr[-2000:]  # the state made the room


ACTIVATIONS = """
import json, sys, torch, pycxl
pool = pycxl.spill_to("dram0")
torch.manual_seed(0)
layers = [m for _ in range(8) for m in (torch.nn.Linear(4096, 4096), torch.nn.GELU())]
model = torch.nn.Sequential(*layers).cuda()  # 0.5 GiB; each step saves 4 GiB of activations
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
if sys.argv[1] == "pressure":  # room for about 3 GiB of the step's 5
    free, _ = torch.cuda.mem_get_info()
    blocker = torch.empty(free - int(3.5 * (1 << 30)), dtype=torch.uint8, device="cuda")
x = torch.randn(16384, 4096, device="cuda")
losses, spilled = [], []
def unplanned():
    m = torch.cuda.memory_stats()
    return m["tier_spilled_bytes.all.allocated"]
for _ in range(6):
    before = unplanned()
    loss = model(x).square().mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
    spilled.append(unplanned() - before)
m = torch.cuda.memory_stats()
print(json.dumps({"losses": losses, "spilled": spilled,
                  "saved_peak": m["tier_saved_activation_bytes.all.peak"]}))
"""


def test_saved_activations_go_to_the_tier_once_a_step_spilled() -> None:
    roomy = _child(ACTIVATIONS, "roomy")
    tight = _child(ACTIVATIONS, "pressure")
    assert roomy["spilled"] == [0] * 6 and roomy["saved_peak"] == 0, roomy
    assert tight["spilled"][0] > 0 and tight["spilled"][-2:] == [0, 0], tight
    assert tight["saved_peak"] >= GiB, tight  # (the state's move to the tier made room too)
    assert tight["losses"] == roomy["losses"]  # the backward pass reads exact copies


TRIPS = """
import gc, json, torch, pycxl
from pycxl.torch.spill_saved import SavedOffload
pool = pycxl.spill_to("dram0")
torch.manual_seed(0)
blocks = [m for _ in range(6) for m in (torch.nn.Linear(2048, 2048), torch.nn.GELU())]
model = torch.nn.Sequential(*blocks).cuda()
x = torch.randn(8192, 2048, device="cuda")
def grads():
    out = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out
def same(a, b):
    return all(torch.equal(p, q) for p, q in zip(a, b))
model(x).square().mean().backward()
plain = grads()
saved = SavedOffload(torch, slot=pool.slot, budget=1 << 40)  # every activation goes
def tier_saved():
    torch.cuda.synchronize()
    return torch.cuda.memory_stats()["tier_saved_activation_bytes.all.current"]
out = {}
with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
    loss = model(x).square().mean()
    out["sent"] = tier_saved()
    loss.backward()
    out["plain"] = same(grads(), plain)
    loss = model(x).square().mean()  # a graph kept for a second backward pass
    loss.backward(retain_graph=True)
    first = grads()
    loss.backward()
    out["retained"] = same(first, plain) and same(grads(), plain)
    kept = model(x).square().mean()  # kept, with another forward pass between its two
    kept.backward(retain_graph=True)
    first = grads()
    other = model(x).square().mean()
    kept.backward()
    again = grads()
    other.backward()
    out["interleaved"] = same(first, plain) and same(again, plain) and same(grads(), plain)
    del loss, kept, other
    for _ in range(20):  # forward passes whose graphs are dropped unused
        model(x).square().mean()
    gc.collect()
    out["left_on_tier"] = tier_saved()
    from torch.utils.checkpoint import checkpoint
    y = x
    for i in range(0, len(blocks), 2):
        y = checkpoint(model[i : i + 2], y, use_reentrant=False)
    y.square().mean().backward()
    out["checkpointed"] = same(grads(), plain)
    # reentrant: the forward pass runs again inside the backward pass, packing there (an
    # input that needs no gradient would leave the output without one)
    y = x.detach().requires_grad_()
    for i in range(0, len(blocks), 2):
        y = checkpoint(model[i : i + 2], y, use_reentrant=True)
    y.square().mean().backward()
    out["reentrant"] = same(grads(), plain)
    side = torch.cuda.Stream()  # a forward pass on a stream of the script's own
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        loss = model(x).square().mean()
    loss.backward()
    torch.cuda.current_stream().wait_stream(side)
    out["side_stream"] = same(grads(), plain)
    del loss
    # a saved tensor read on another stream than its own (from the graph, outside the
    # backward pass) after the read of a later one brought it back ahead on its own
    with torch.cuda.stream(side):
        h = model[0](x)
        out_g = model[1](h)
        mid = model[2](out_g)
        later = model[3](mid)
    late_input = later.grad_fn._saved_self  # GELU's input, saved on side, read here
    early_input = out_g.grad_fn._saved_self  # brought back ahead on side, asked here
    torch.cuda.current_stream().wait_stream(side)
    out["asked_elsewhere"] = torch.equal(early_input, h) and torch.equal(late_input, mid)
    del h, out_g, mid, later, late_input, early_input
    gc.collect()
    out["left_at_end"] = tier_saved()
print(json.dumps(out))
"""


def test_saved_activations_cross_the_link_beside_the_compute_and_come_back_exact() -> None:
    """The copy stream's trips: gradients bitwise those of a run without the hooks, with a
    graph kept for a second backward pass (and another forward pass between the two),
    with checkpointed blocks (reentrant: saved in the backward pass), with a forward pass
    on a stream of the script's own and a saved tensor read on another, and nothing left
    on the tier by graphs dropped unused."""
    r = _child(TRIPS)
    assert r["sent"] >= 6 * 8192 * 2048 * 4, r  # each block's input and its GELU's input
    assert r["plain"] and r["retained"] and r["interleaved"], r
    assert r["checkpointed"] and r["reentrant"] and r["side_stream"], r
    assert r["asked_elsewhere"], r
    assert r["left_on_tier"] == 0 and r["left_at_end"] == 0, r


HANDLE = """
import json, sys, torch, pycxl
from pycxl.base.errors import CudaError, InvalidRequestError
from pycxl.gpu.context import GpuContext
from pycxl.gpu.memory import DeviceMemory
from pycxl.torch import tier
pool = pycxl.spill_to("dram0")
if sys.argv[1] == "unhooked":
    tier._handles.remove()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 1024)).cuda()
x = torch.randn(256, 1024, device="cuda")
y = model(x)  # the first module call with gradients, while HBM has room
fired = not tier._handles.installed
with torch.no_grad():  # the backward pass's kernels loaded on this thread (lazily loaded
    g = torch.ones_like(y)  # kernels take memory too), its GEMMs on this thread's handle
    h = model[0](x)
    keep = [g.t() @ h, g @ model[2].weight, torch.ops.aten.threshold_backward(g, h, 0),
            g.sum(0), torch.relu(h).t() @ g]
torch.cuda.synchronize()
ctx = GpuContext(0)
held, size = [], 1 << 30
while size >= 2 << 20:  # HBM full in the driver's count, as a step that outgrew it leaves it
    try:
        held.append(DeviceMemory(ctx, size))
    except (CudaError, InvalidRequestError):
        size //= 2
try:
    y.sum().backward()
    torch.cuda.synchronize()
    out = {"ok": True, "norm": float(model[0].weight.grad.norm()), "fired": fired}
except RuntimeError as e:
    out = {"ok": False, "error": str(e).splitlines()[0][:300], "fired": fired}
print(json.dumps(out))
"""


def test_the_backward_pass_finds_its_cublas_handle_made_before_hbm_filled() -> None:
    """The crash of a first step at 2x oversubscription: autograd's thread made its
    cuBLAS handle at the backward pass's first GEMM, with HBM full, and cuBLAS failed
    inside (CUBLAS_STATUS_ALLOC_FAILED). Unhooked, the same program fails so; hooked, the
    handle was made at the first module call and the backward pass runs."""
    unhooked = _child(HANDLE, "unhooked")
    hooked = _child(HANDLE, "hooked")
    assert not unhooked["ok"] and "CUBLAS" in unhooked["error"], unhooked
    assert hooked["fired"] and hooked["ok"] and hooked["norm"] > 0, hooked


STREAM = """
import json, os, sys, torch, pycxl
from pycxl.base._lib import compiled
os.environ["PYCXL_SPILL_STREAM_WEIGHTS"] = sys.argv[1]
pool = pycxl.spill_to("dram0")
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, dtype=torch.bfloat16)
                              for _ in range(8)]).cuda().eval()
for layer in list(model)[4:]:  # the last four spilled, as a model made on a full GPU is
    for p in layer.parameters():
        p.data = pycxl.move(p.data, "dram0")
torch.cuda.synchronize()
# the pool's idle memory (the four layers' HBM copies, freed) given back and counted too
room = compiled.tier_hbm_room(0, settle=True)
blocker = torch.empty(room - (560 << 20), dtype=torch.uint8, device="cuda")  # headroom + 48 MiB
on_tier = lambda t: compiled.tier_owns(t.untyped_storage().data_ptr())
read = []
for layer in model:
    layer.register_forward_pre_hook(lambda m, a: read.append(on_tier(m.weight)))
x = torch.randn(1, 4096, dtype=torch.bfloat16, device="cuda")
outs = []
with torch.inference_mode():
    for _ in range(4):
        read.clear()
        outs.append(model(x).float().cpu())
torch.cuda.synchronize()
print(json.dumps({"out": [o.view(-1)[:64].tolist() for o in outs],
                  "equal": all(torch.equal(o, outs[0]) for o in outs),
                  "read_on_tier": read, "own_on_tier": [on_tier(l.weight) for l in model]}))
"""


def test_spilled_weights_streamed_by_copy_give_the_in_place_results() -> None:
    """Inference over weights half on the tier (the last half), HBM left without room for
    the ring: read in place, and streamed through HBM (the tier's weights exchanged for
    the first called, then the HBM weights called next moved to make room, so the tier
    holds a run of the first called); the streamed passes read no weight on the tier and
    give the in-place outputs bit for bit. Streaming is the default (the variable
    unset)."""
    in_place = _child(STREAM, "0")
    streamed = _child(STREAM, "1")
    default = _child(STREAM, "")
    assert in_place["read_on_tier"] == [False] * 4 + [True] * 4, in_place
    assert streamed["read_on_tier"] == [False] * 8, streamed
    on_tier = streamed["own_on_tier"]
    assert on_tier[:4] == [True] * 4 and sum(on_tier) > 4 and not on_tier[-1], streamed
    assert on_tier == sorted(on_tier, reverse=True), streamed  # the first called, in a run
    assert default["read_on_tier"] == streamed["read_on_tier"]
    assert default["own_on_tier"] == on_tier and default["out"] == streamed["out"]
    assert in_place["equal"] and streamed["equal"]
    assert streamed["out"] == in_place["out"]
