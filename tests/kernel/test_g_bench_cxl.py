"""Each benchmark against a real CXL node (testbed): it runs, validates, and the pages it
measured sat on the CXL node. Tiny buffers: CXL memory is very slow under emulation."""

from __future__ import annotations

import pytest

from pycxl.bench.bandwidth import measure_bandwidth
from pycxl.bench.first_touch import measure_first_touch
from pycxl.bench.latency import measure_latency
from pycxl.cxl import regions
from pycxl.cxl.region_layout import RegionRequest

SIZE = 256 << 10


@pytest.mark.kernel(topology="two-dev")
def test_benchmarks_measure_pages_on_the_cxl_node() -> None:
    made = regions.create_region(RegionRequest(ways=2))
    node = made.numa_node
    assert made.tier == "cxl0" and node is not None

    lat = measure_latency("cxl0", size=SIZE, samples=2, loads=1 << 14)
    assert lat.node == node and lat.initiator == "dram0" and lat.figures["latency_ns"] > 0
    assert lat.params["pages_on_node"] == lat.params["pages"] == SIZE // 4096

    bw = measure_bandwidth("cxl0", size=SIZE, ntimes=2, kernel="triad", threads=1)
    assert bw[0].node == node and bw[0].figures["bytes_per_s"] > 0
    assert bw[0].params["pages_on_node"] == SIZE // 4096

    ft = measure_first_touch("cxl0", size=SIZE)
    assert ft.node == node and ft.figures["p50_ns"] > 0
    assert ft.params["pages_on_node"] == SIZE // 4096
    regions.destroy_region(made.name)
