"""pycxl.fit on the GPU machine: the rates it measures here (the CPU update and the
link alone and beside each other, the GPU's matrix multiply) are this machine's, and
the bound it gives carries the update that begins at step()."""

from __future__ import annotations

import pytest

import pycxl

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def test_fit_measures_the_rates_alone_and_beside_each_other_here() -> None:
    shape = pycxl.TrainShape.decoder(layers=8, hidden=2048)
    planned = pycxl.fit(shape, "dram0", "gpu0", tokens=2048)
    m = planned.machine
    assert m.hbm_free and m.link and m.cpu_update and m.gpu_flops and m.shared, m
    cpu, link = m.shared
    assert 0 < cpu <= m.cpu_update and 0 < link <= m.link, m
    assert m.link > 1e9 and m.gpu_flops > 1e12  # a PCIe or NVLink GPU's, in bytes and FLOPs
    c = planned.chosen
    assert c is not None and c.step_s is not None, planned.why
    assert "update_then_backward" in c.parts_s and c.step_s == max(c.parts_s.values())
    early = pycxl.fit(shape, "dram0", "gpu0", tokens=2048, update_in_backward=True)
    resident = next(o for o in early.options if o.name == "resident")
    assert "update_then_backward" not in resident.parts_s
