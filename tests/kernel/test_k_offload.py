"""Optimizer state on a CXL node, on the real kernel, without a GPU: offload_layers
places each layer's parameters and Adam's moments on the CXL tier, the training steps
update them there in place, and the pages are counted on that node (not assumed); so
does offload_model for a whole model's blocks, their weights resident or streamed from
the CXL node."""

from __future__ import annotations

import copy
import functools

import pytest

import pycxl
from pycxl.cxl.region_layout import RegionRequest
from pycxl.numa.pages import pages_by_node


@pytest.mark.kernel(topology="two-dev")
def test_layers_and_adam_state_live_on_the_cxl_node_and_train_in_place() -> None:
    torch = pytest.importorskip("torch")
    made = pycxl.create_region(RegionRequest(ways=2))
    node = made.numa_node
    assert node is not None
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))
    layers = [model[0], model[2]]
    before = [p.detach().clone() for p in model.parameters()]
    adam = functools.partial(torch.optim.Adam, lr=1e-2)
    offload = pycxl.offload_layers(layers, "cxl0", gpu=None, weights="resident", optimizer=adam)
    where = [p.data_ptr() for p in model.parameters()]
    x, y = torch.randn(8, 64), torch.randn(8, 64)
    for _ in range(2):
        torch.nn.functional.mse_loss(model(x), y).backward()
    offload.synchronize()
    # trained, in place: the same memory, other values
    assert [p.data_ptr() for p in model.parameters()] == where
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    pages = offload.pages_by_node()
    assert set(pages) == {node} and pages[node] >= 3 * len(layers)  # params, two moments
    offload.close()

    # A whole model with offload_model: its blocks' fp32 masters and both moments on the
    # CXL node, updated there by the fused CPU step, the model equal to plain AdamW
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(3))
    whole = torch.nn.Sequential(torch.nn.Linear(64, 64), blocks)
    ref = [p.detach().clone().requires_grad_() for p in whole.parameters()]
    plain = torch.optim.AdamW(ref, lr=1e-2)
    off = pycxl.offload_model(whole, "cxl0", None,
                              optimizer=torch.optim.AdamW(whole.parameters(), lr=1e-2))  # fmt: skip

    def forward(params: list[torch.Tensor]) -> torch.Tensor:
        h = x
        for k in range(0, len(params), 2):
            h = torch.tanh(torch.nn.functional.linear(h, params[k], params[k + 1]))
        return torch.nn.functional.mse_loss(h, y)

    for _ in range(3):
        for params, opt in ((ref, plain), (list(whole.parameters()), off.optimizer)):
            forward(params).backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(ref, whole.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    pages = off.pages_by_node()
    assert set(pages) == {node} and pages[node] >= 3  # a page of state per block at least
    off.close()

    # The blocks' weights and gradients on the CXL node too: each block's parameters are
    # its memory there between uses, and the model trains as plain AdamW
    torch.manual_seed(0)

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = torch.nn.Linear(64, 64)
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(3))

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            h = torch.tanh(self.first(h))
            for block in self.blocks:
                h = torch.tanh(block(h))
            return h

    stack = Stack()
    twin = copy.deepcopy(stack)
    plain = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    adamw = torch.optim.AdamW(stack.parameters(), lr=1e-2)
    streamed = pycxl.offload_model(stack, "cxl0", None, weights="stream", optimizer=adamw)
    for _ in range(3):
        for m, opt in ((twin, plain), (stack, streamed.optimizer)):
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(twin.parameters(), stack.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    weight = stack.blocks[1].weight
    torch.nn.functional.mse_loss(stack(x), y).backward()
    assert set(pages_by_node(weight.detach())) == {node}
    assert weight.grad is not None and set(pages_by_node(weight.grad)) == {node}
    pages = streamed.pages_by_node()
    assert set(pages) == {node} and pages[node] >= 3 * 3  # state, weights, gradients
    streamed.close()
