"""Each benchmark against a real CXL node (testbed): it runs, validates, and the pages it
measured sat on the CXL node. Tiny buffers: CXL memory is very slow under emulation."""

from __future__ import annotations

import pytest

import pycxl
from pycxl import bench
from pycxl.cxl.region_layout import RegionRequest
from pycxl.measure.results import BandwidthResult

SIZE = 256 << 10


@pytest.mark.kernel(topology=("two-dev", "two-socket"))
def test_benchmarks_measure_pages_on_the_cxl_node() -> None:
    made = pycxl.create_region(RegionRequest(ways=2, zone="movable"))
    node = made.numa_node
    assert made.tier == "cxl0" and node is not None

    (lat,) = bench.measure_latency("cxl0", size=SIZE, samples=2, loads=1 << 14)
    assert lat.node == node and lat.initiator == "dram0" and lat.latency_ns > 0
    assert lat.pages_on_node == lat.pages == SIZE // 4096

    (bw,) = bench.measure_bandwidth("cxl0", size=SIZE, samples=1, kernel="triad", threads=1)
    assert isinstance(bw, BandwidthResult) and bw.node == node and bw.bytes_per_s > 0
    assert bw.pages_on_node == bw.pages == 3 * SIZE // 4096

    (ft,) = bench.measure_first_touch("cxl0", size=SIZE)
    assert ft.node == node and ft.p50_ns > 0
    assert ft.pages_on_node == SIZE // 4096
    pycxl.destroy_region(made.name)
