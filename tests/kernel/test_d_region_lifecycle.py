"""`pycxl region create --interleave 2` on the real kernel, from fresh memdevs to a NUMA
node that holds a buffer's pages; disable, enable, destroy back to the first state.

Runs after the enumeration, rejection and fault tests of the same boot (file order).
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest

from pycxl.byname.listing import ListRequest, list_json
from pycxl.cxl import libcxl_backend, sysfs_backend
from pycxl.resolve.system import snapshot
from tests.kernel.kernel_helpers import (
    backend_differences,
    cxl_state,
    ndctl,
    pages_by_node,
    pycxl_cli,
    state_diff,
)
from tests.ndctl_compare import compare

MiB = 1 << 20


def _region_cli(*args: str) -> Any:
    """create's one object; the list destroy, disable and enable print, whatever the count."""
    p = pycxl_cli("region", *args, "--json")
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # nothing but JSON on stdout, nothing on stderr
    doc = json.loads(p.stdout)
    assert isinstance(doc, dict if args[0] == "create" else list), doc
    return doc


@pytest.mark.kernel(topology="two-dev")
def test_create_online_use_disable_enable_destroy() -> None:
    first = cxl_state()
    # movable: the kernel keeps its own allocations out, so the region can always be
    # offlined and destroyed (the default, normal, trades that for GPU pinning)
    doc = _region_cli("create", "--interleave", "2", "--zone", "movable")
    name, node = doc["region"], doc["numa_node"]
    assert doc["tier"] == "cxl0" and isinstance(node, int)
    assert doc["interleave_ways"] == 2 and doc["size"] == 512 * MiB
    assert [m["position"] for m in doc["mappings"]] == [0, 1]  # type: ignore[index]

    s = snapshot(gpus=False)
    region = s.cxl.region(str(name))
    assert region.committed and region.enabled and region.numa_nodes == [node]
    (dax,) = region.dax_devices
    assert dax.mode == "system-ram" and dax.movable
    assert dax.online_memblocks == dax.total_memblocks > 0
    tier = {t.name: t for t in s.nodes}["cxl0"]
    assert tier.node.id == node and tier.node.cpuless and tier.region == name
    assert tier.node.mem_total == region.size
    out = subprocess.run(["numactl", "-H"], capture_output=True, text=True, check=True).stdout
    assert f"node {node} size: {region.size >> 20} MB" in out
    assert re.search(rf"^node {node} cpus:\s*$", out, re.MULTILINE), out

    # a small buffer bound to the node lands there, page by page
    assert pages_by_node(4, f"--membind={node}") == {node: 4 * MiB // 4096}

    # ndctl and daxctl read the same region and dax device
    n, diffs = compare(
        list_json(s, ListRequest.showing("regions", targets=True)), ndctl("-R", "-T"), ("region",)
    )
    assert (n, diffs) == (1, [])
    daxctl = json.loads(
        subprocess.run(["daxctl", "list"], capture_output=True, text=True, check=True).stdout
    )
    ours = list_json(s, ListRequest.showing("dax"))
    for key in ("chardev", "size", "target_node", "mode", "online_memblocks",
                "total_memblocks", "movable"):  # fmt: skip
        assert ours[0][key] == daxctl[0][key], key
    assert backend_differences(sysfs_backend.read_topology(), libcxl_backend.read_topology()) == []
    p = pycxl_cli("list")
    assert p.returncode == 0 and "cxl0" in p.stdout and str(name) in p.stdout

    # disable: memory offline and gone, decode still committed; enable brings it back
    (doc,) = _region_cli("disable", str(name))
    assert doc["state"] == "disabled" and doc["decode_state"] == "commit"
    assert doc["numa_node"] is None and snapshot(gpus=False).cxl.region(str(name)).dax_devices == []
    (doc,) = _region_cli("enable", str(name), "--zone", "movable")
    assert doc["tier"] == "cxl0" and doc["numa_node"] == node
    assert pages_by_node(1, f"--membind={node}") == {node: MiB // 4096}

    # destroy returns every CXL object to its first state; create works again
    p = pycxl_cli("region", "destroy", str(name))
    assert p.returncode == 0 and f"{name} destroyed" in p.stdout, p.stderr
    assert state_diff(first, cxl_state()) == []
    doc = _region_cli("create", "-w", "2", "--no-online")
    assert doc["numa_node"] is None and doc["decode_state"] == "commit"
    _region_cli("destroy", str(doc["region"]))
    assert state_diff(first, cxl_state()) == []


@pytest.mark.kernel(topology="two-dev")
def test_region_commands_take_several_regions_and_all() -> None:
    """As cxl destroy-region / disable-region / enable-region: names or 'all'."""
    first = cxl_state()
    a = _region_cli("create", "-m", "0x1", "--zone", "movable")
    b = _region_cli("create", "-m", "0x2", "-b", "root0", "--zone", "movable")
    names = [str(a["region"]), str(b["region"])]
    docs = _region_cli("disable", *names)
    assert [d["region"] for d in docs] == names  # type: ignore[index]
    docs = _region_cli("enable", "all", "--zone", "movable")
    # one CXL window, one proximity domain: both regions feed the same node
    assert [d["tier"] for d in docs] == ["cxl0", "cxl0"]  # type: ignore[index]
    p = pycxl_cli("region", "destroy", "all")
    assert p.returncode == 0, p.stderr
    assert all(f"{n} destroyed" in p.stdout for n in names), p.stdout
    assert state_diff(first, cxl_state()) == []
    p = pycxl_cli("region", "destroy", "all")
    assert p.returncode == 0 and "no regions" in p.stdout
