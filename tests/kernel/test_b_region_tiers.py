"""After a region is committed and onlined (raw sysfs protocol), pycxl names the tier.

Runs after the enumeration tests of the same boot (file order): it changes state.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from pycxl.cxl import libcxl_backend, sysfs_backend
from pycxl.listing import ListRequest, list_json
from pycxl.system import snapshot
from tests.kernel.kernel_helpers import backend_differences, create_raw_region, ndctl, pycxl
from tests.ndctl_compare import compare


@pytest.mark.kernel(topology="two-dev")
def test_region_feeds_a_cxl_tier() -> None:
    create_raw_region("0x1 0x2")
    s = snapshot(gpus=False)
    (region,) = s.cxl.regions
    assert region.committed and region.enabled and region.interleave_ways == 2
    (node,) = region.numa_nodes
    tier = {nt.name: nt for nt in s.nodes}["cxl0"]
    assert tier.node.id == node and tier.node.cpuless and tier.region == region.name
    assert tier.node.mem_total == region.size
    # numactl reads the same node
    out = subprocess.run(["numactl", "-H"], capture_output=True, text=True, check=True).stdout
    assert f"node {node} size: {region.size >> 20} MB" in out
    # ndctl agrees on the region and its mappings; daxctl on the dax device
    n, diffs = compare(
        list_json(s, ListRequest(regions=True, targets=True)), ndctl("-R", "-T"), ("region",)
    )
    assert (n, diffs) == (1, [])
    dax = json.loads(subprocess.run(["daxctl", "list"], capture_output=True, text=True,
                                    check=True).stdout)  # fmt: skip
    ours = list_json(s, ListRequest(dax=True))
    for key in ("chardev", "size", "target_node", "mode", "online_memblocks", "total_memblocks",
                "movable"):  # fmt: skip
        assert ours[0][key] == dax[0][key], key
    assert backend_differences(sysfs_backend.read_topology(), libcxl_backend.read_topology()) == []
    p = pycxl("list")
    assert p.returncode == 0 and "cxl0" in p.stdout and region.name in p.stdout
