"""NUMA control against a real CXL node (testbed): placement, interleave, weighted
interleave, migration and `pycxl run --membind cxl0`, page by page.

The emulator is slow and fragile where the guest touches CXL memory (see
docs/testbed.md): buffers here are 256 KiB, and the commands run under a CXL policy are
small programs, not a Python interpreter.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import pycxl
from pycxl.cxl import regions
from pycxl.cxl.region_layout import RegionRequest
from pycxl.numa import placement
from pycxl.numa.policy import Policy, read_weights, write_weights
from pycxl.resolve.system import snapshot
from tests.kernel.kernel_helpers import pycxl_cli

SIZE = 256 << 10
PAGES = SIZE // 4096


@pytest.mark.kernel(topology=("two-dev", "two-socket"))
def test_placement_policies_and_migration_on_a_cxl_node() -> None:
    made = pycxl.create_region(RegionRequest(ways=2, zone="movable"))
    assert made.tier == "cxl0" and made.numa_node is not None
    cxl = made.numa_node
    dram = snapshot(gpus=False).resolve("dram0").node
    assert dram is not None and dram != cxl

    with pycxl.allocate(SIZE, "cxl0") as buf:
        assert buf.pages_by_node() == {cxl: PAGES}
        # migrate to DRAM and back: every page moves, and later faults follow
        assert pycxl.migrate(buf, "dram0") == {dram: PAGES}
        assert pycxl.migrate(buf, "cxl0") == {cxl: PAGES}

    # interleave spreads pages one by one across the two nodes: half each (+-1 page)
    with placement.allocate(SIZE, policy=Policy.interleave(dram, cxl)) as buf:
        counts = buf.pages_by_node()
        assert counts.keys() == {dram, cxl} and abs(counts[dram] - counts[cxl]) <= 1, counts

    # weighted interleave 3:1 (Linux 6.9+): round robin by weight, so 3:1 within 5%
    before = read_weights()
    previous = write_weights({dram: 3, cxl: 1})
    try:
        with placement.allocate(SIZE, policy=Policy.weighted_interleave(dram, cxl)) as buf:
            counts = buf.pages_by_node()
    finally:
        write_weights(previous)
    assert read_weights() == before
    assert 2.85 <= counts[dram] / counts[cxl] <= 3.15, counts

    # a numpy array made without any policy moves to the CXL node
    a = np.ones(SIZE // 8)
    assert set(pycxl.migrate(a, "cxl0")) == {cxl}

    # pycxl run: the child runs under the policy, as its own numa_maps says
    p = pycxl_cli("run", "--membind", "cxl0", "--", "cat", "/proc/self/numa_maps")
    assert p.returncode == 0, p.stderr
    anon = [ln for ln in p.stdout.splitlines() if "anon=" in ln]
    assert anon and all(f"bind:{cxl}" in ln for ln in anon), p.stdout
    assert all(re.search(rf"\bN{cxl}=\d+", ln) and f" N{dram}=" not in ln for ln in anon)
    # numactl 2.0.19's form: -w takes the nodes and uses the system-wide weights, which
    # pycxl numa --set-weights sets on purpose (and pycxl run never changes)
    p = pycxl_cli("numa", "--set-weights", "dram0=3,cxl0=1", "--json")
    assert p.returncode == 0, p.stderr
    weights = {n["name"]: n["weight"] for n in json.loads(p.stdout)}
    assert (weights["dram0"], weights["cxl0"]) == (3, 1)
    try:
        p = pycxl_cli("run", "-w", "dram0,cxl0", "--", "cat", "/proc/self/numa_maps")
    finally:
        write_weights(before)
    # numa_maps prints the node list as the kernel does: a range, or ids with commas
    nodes = f"{dram}-{cxl}" if cxl == dram + 1 else f"{dram},{cxl}"
    assert p.returncode == 0 and f"weighted interleave:{nodes}" in p.stdout, p.stdout
    regions.destroy_region(made.name)
