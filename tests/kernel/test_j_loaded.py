"""Loaded latency on the testbed's CXL node (small sizes: the emulator is slow): curves
for every mix with the memory on cxl0, cross-tier (chase cxl0, load dram0), peak
bandwidth by mix, the matrix's loaded cells, and the refusals."""

from __future__ import annotations

import json
import os

import pytest

import pycxl
from pycxl.cxl.region_layout import RegionRequest
from tests.kernel.kernel_helpers import pycxl_cli

SMALL = ["--size", "256K", "--load-size", "2M", "--duration", "0.2", "--steps", "3"]


def _json(*args: str) -> list[dict[str, object]]:
    p = pycxl_cli(*args, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert isinstance(doc, list)
    return doc


@pytest.mark.kernel(topology="two-dev")
def test_loaded_latency_curves_on_cxl() -> None:
    os.environ["PYCXL_BENCH_QUICK"] = "1"
    made = pycxl.create_region(RegionRequest(ways=2, zone="movable"))
    node = made.numa_node
    docs = _json("bench", "loaded-latency", "--target", "cxl0", "--mix", "all", *SMALL)
    assert [d["mix"] for d in docs] == ["read", "3:1", "2:1", "1:1", "nt-write"]
    for d in docs:
        assert d["node"] == node and d["load_node"] == node and d["load_target"] == "cxl0"
        assert d["pages_on_node"] == d["pages"] and d["load_pages_on_node"] == d["load_pages"]
        points = d["points"]
        assert isinstance(points, list) and len(points) == 4  # idle, 2 paced, unpaced
        idle = points[0]
        assert idle["target_bytes_per_s"] is None and idle["achieved_bytes_per_s"] == 0
        assert any(p["unpaced"] for p in points)
        assert all(p["windows"] > 0 and p["latency_ns"] > 0 for p in points)
        for p in points:
            if p["target_bytes_per_s"] is not None:
                assert p["reached"] == (p["achieved_ratio"] >= 0.95)

    # cross-tier: the chase on cxl0 while the other CPU loads dram0
    (cross,) = _json("bench", "loaded-latency", "-t", "cxl0", "--load-on", "dram0", *SMALL)
    assert cross["load_target"] == "dram0" and cross["load_node"] == 0 and cross["node"] == node

    # peak bandwidth by mix, on cxl0
    peaks = _json("bench", "bandwidth", "-t", "cxl0", "--mix", "all", "--size", "2M")
    assert [p["kernel"] for p in peaks] == ["read", "3:1", "2:1", "1:1", "nt-write"]
    assert all(p["node"] == node and p["pages_on_node"] == p["pages"] for p in peaks)

    # the matrix's loaded cells: CPU initiators x host tiers, at 50% and 90% of the peak
    cells = _json("bench", "matrix", "--no-latency", "--loaded", "--size", "256K")
    loaded = [c for c in cells if c["matrix"] == "loaded"]
    assert {c["target"] for c in loaded} == {"dram0", "cxl0"}
    for c in loaded:
        paced = [p for p in c["points"] if p["target_bytes_per_s"] is not None]
        ratios = sorted(p["target_bytes_per_s"] / c["peak_bytes_per_s"] for p in paced)
        assert ratios == pytest.approx([0.5, 0.9])


@pytest.mark.kernel(topology="two-dev")
def test_loaded_latency_refusals() -> None:
    os.environ["PYCXL_BENCH_QUICK"] = "1"
    pycxl.create_region(RegionRequest(ways=2, zone="movable"))
    for args, code, words in (
        (["--load-threads", "2"], 2, "1 CPUs of dram0 are left"),  # 2 CPUs, one chases
        (["--mix", "4:1"], 2, "mix '4:1'"),
        (["--rates", "100000"], 2, "above what"),
        (["--load-from", "gpu0"], 5, "the PCI bus shows 0 NVIDIA GPUs"),  # none in the guest
    ):
        small = SMALL[:-2] if args[0] == "--rates" else SMALL  # rates name their own points
        p = pycxl_cli("bench", "loaded-latency", "-t", "cxl0", *small, *args)
        assert p.returncode == code and words in p.stderr, (args, p.stderr)
