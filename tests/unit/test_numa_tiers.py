"""NUMA nodes, tier classification and target names."""

from __future__ import annotations

from pathlib import Path

import pytest

from pycxl.base.errors import InvalidRequestError, NotFoundError
from pycxl.base.sysfs import Sysfs
from pycxl.numa import libnuma
from pycxl.numa.nodes import read_nodes
from pycxl.resolve.system import snapshot
from pycxl.resolve.tiers import explicit_cxl_nodes


def test_region_tree_has_a_cxl_node(trees: Path) -> None:
    s = snapshot(str(trees / "two-dev/region"), gpus=False)
    names = {nt.name: nt for nt in s.nodes}
    assert sorted(names) == ["cxl0", "dram0"]
    cxl = names["cxl0"]
    assert cxl.node.id == 1 and cxl.node.cpuless and cxl.region == "region0"
    assert cxl.node.mem_total == 512 << 20
    assert cxl.node.distances == {0: 20, 1: 10}
    assert names["dram0"].node.cpus == (0, 1)
    t = s.resolve("cxl0")
    assert (t.kind, t.node, t.tier) == ("node", 1, "cxl")
    assert s.resolve("node1").node == 1 and s.resolve("1").tier == "cxl"
    assert s.resolve("cpu1", initiator=True).node == 0


def test_unknown_target_lists_known_names(trees: Path) -> None:
    s = snapshot(str(trees / "two-dev/fresh"), gpus=False)
    with pytest.raises(NotFoundError) as e:
        s.resolve("cxl0")
    assert "known: dram0, node0" in str(e.value)
    with pytest.raises(InvalidRequestError, match="holds no memory"):
        s.resolve("cpu0")


def test_explicit_cxl_mapping_is_only_by_request(trees: Path) -> None:
    # the usual emulation: the remote socket stands in for CXL
    s = snapshot(str(trees / "two-socket/fresh"), gpus=False, explicit_cxl="1")
    dram, cxl = s.nodes
    assert (dram.name, dram.tier) == ("dram0", "dram")
    assert (cxl.name, cxl.tier, cxl.explicit) == ("cxl0", "cxl", True)
    # never the only socket (no DRAM tier would be left), never a node that is not there
    with pytest.raises(InvalidRequestError, match="every node with CPUs"):
        snapshot(str(trees / "two-dev/fresh"), gpus=False, explicit_cxl="0")
    with pytest.raises(InvalidRequestError, match="node 7 does not exist"):
        snapshot(str(trees / "two-dev/fresh"), gpus=False, explicit_cxl="7")
    assert explicit_cxl_nodes("") == ()
    with pytest.raises(InvalidRequestError, match="PYCXL_CXL_NODES"):
        explicit_cxl_nodes("two")


def test_live_nodes_agree_with_libnuma() -> None:
    """This machine's own nodes, read from sysfs and from the real libnuma."""
    nodes = read_nodes(Sysfs("/"))
    sizes = libnuma.node_sizes()
    assert [n.id for n in nodes if n.has_memory] == sorted(sizes)
    for n in nodes:
        if n.has_memory:
            assert n.mem_total == sizes[n.id][0]
        for other, d in n.distances.items():
            assert libnuma.distance(n.id, other) == d
