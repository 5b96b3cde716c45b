"""Two sockets, on trees recorded from the testbed's two-socket topology (Linux 6.12): the
platform's advertised figures, each node's nearest socket, and what the CLI shows of
them; the weights rule and its plan."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pycxl.base.errors import InvalidRequestError
from pycxl.base.plan import PlanFailed
from pycxl.base.sysfs import Sysfs
from pycxl.base.units import parse_size
from pycxl.numa.access import cpu_figures
from pycxl.numa.policy import (
    WEIGHTS_DIR,
    read_weight_mode,
    read_weights,
    weights_auto_path,
    weights_plan,
)
from pycxl.numa.weights import WEIGHTINESS, weights_from_bandwidth
from pycxl.resolve.system import snapshot
from pycxl.testbed.topologies import TOPOLOGIES

HMAT = TOPOLOGIES["two-socket"].hmat
assert HMAT is not None


def cli(*args: str, sysroot: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycxl.cli.main", *args, "--sysroot",
                           str(sysroot)], capture_output=True, text=True, check=False)  # fmt: skip


def test_each_sockets_dram_is_advertised_for_its_own_cpus(trees: Path) -> None:
    s = snapshot(str(trees / "two-socket/fresh"), gpus=False)
    by_name = {t.name: t for t in s.nodes}
    assert list(by_name) == ["dram0", "dram1"]
    for t in by_name.values():
        adv = t.node.advertised
        assert adv is not None and adv.access_class == 1 and adv.initiators == (t.node.id,)
        assert adv.read_latency_ns == HMAT.dram_local.latency_ns
        assert adv.read_bytes_per_s == parse_size(HMAT.dram_local.bandwidth)
        assert [a.access_class for a in t.node.access] == [0, 1]
        assert (t.near, t.near_by) == (t.node.id, "self")
    assert s.advertised(0, (0,)) is not None
    assert s.advertised(0, (1,)) is None  # socket 1's CPU: HMAT's remote figure is not shown
    assert [m.numa_node for m in sorted(s.cxl.memdevs, key=lambda m: m.serial or 0)] == [
        0, 0, 1, 1,
    ]  # fmt: skip


def test_cxl_nodes_belong_to_the_socket_their_memdevs_hang_off(trees: Path) -> None:
    s = snapshot(str(trees / "two-socket/regions"), gpus=False)
    t = {x.name: x for x in s.nodes}
    cxl0, cxl1 = t["cxl0"], t["cxl1"]
    # the kernel gives CXL nodes one distance to every node: distance cannot decide
    assert cxl1.node.distances[0] == cxl1.node.distances[1]
    assert (cxl0.memdev_nodes, cxl0.near, cxl0.near_by) == ((0,), 0, "memdevs")
    assert (cxl1.memdev_nodes, cxl1.near, cxl1.near_by) == ((1,), 1, "memdevs")
    assert s.nearest_cpu_node(cxl1.node.id).name == "dram1"
    assert s.pair("cxl1").initiator.name == "dram1"
    assert [x.name for x in s.near_tiers(1)] == ["dram1", "cxl1"]
    # a CXL node's figures are its region's, with no initiator named: they are for the
    # socket of its host bridges
    (r1,) = [r for r in s.cxl.regions if r.numa_nodes == [cxl1.node.id]]
    assert cxl1.node.advertised == cpu_figures(r1.access) and r1.memdev_nodes == [1]
    assert cxl1.node.advertised is not None and cxl1.node.advertised.initiators == ()
    assert s.advertised(cxl1.node.id, (1,)) == cxl1.node.advertised
    assert s.advertised(cxl1.node.id, (0,)) is None


def test_the_cli_shows_near_and_advertised(trees: Path) -> None:
    tree = trees / "two-socket/regions"
    p = cli("list", "-N", sysroot=tree)
    assert p.returncode == 0, p.stderr
    lines = {ln.split()[1]: ln for ln in p.stdout.splitlines() if ln[:1].isdigit()}
    assert "near" in p.stdout and "advertised" in p.stdout
    assert " dram1 " in lines["cxl1"] and "not advertised" not in lines["cxl1"]
    nodes = {n["name"]: n for n in json.loads(cli("list", "-N", "--json", sysroot=tree).stdout)}
    assert (nodes["cxl1"]["near_node"], nodes["cxl1"]["near_by"]) == (1, "memdevs")
    adv = nodes["dram0"]["advertised"]
    assert adv["read_latency_ns"] == HMAT.dram_local.latency_ns and adv["initiators"] == [0]
    regions = json.loads(cli("list", "-R", "--json", sysroot=tree).stdout)
    assert sorted(r["memdev_nodes"] for r in regions) == [[0], [1]]
    assert all(r["advertised"]["read_bytes_per_s"] > 0 for r in regions)
    p = cli("list", "-R", sysroot=tree)
    assert "memdevs on" in p.stdout and "dram1" in p.stdout
    p = cli("numa", sysroot=tree)
    assert "weights: manual" in p.stdout and "advertised" in p.stdout, p.stdout


@pytest.mark.parametrize(
    ("bandwidth", "weights"),
    [
        ({0: 200e9, 1: 50e9}, {0: 25, 1: 6}),  # 32 x 0.8 = 25.6, 32 x 0.2 = 6.4
        ({0: 100e9, 1: 100e9}, {0: 1, 1: 1}),  # 16:16, divided by 16
        ({0: 30e9, 1: 1e6}, {0: 31, 1: 1}),  # a tiny share is still 1
        ({0: 3.0, 1: 1.0, 2: 4.0}, {0: 3, 1: 1, 2: 4}),  # 12:4:16 / 4
    ],
)
def test_weights_follow_the_kernels_rule(bandwidth: dict[int, float],
                                         weights: dict[int, int]) -> None:  # fmt: skip
    got = weights_from_bandwidth(bandwidth)
    assert got == weights and all(1 <= w <= WEIGHTINESS for w in got.values())


def test_weights_need_measured_bandwidth() -> None:
    with pytest.raises(InvalidRequestError, match="node 1 has no measured bandwidth"):
        weights_from_bandwidth({0: 1e9, 1: 0.0})


def test_weights_plan_sets_and_undoes_on_a_recorded_tree(tmp_path: Path, trees: Path) -> None:
    tree = tmp_path / "t"
    shutil.copytree(trees / "two-socket/fresh", tree, symlinks=True)
    fs = Sysfs(tree)
    assert read_weight_mode(fs) == "manual" and weights_auto_path(fs) is None  # Linux 6.12
    plan = weights_plan({0: 5, 1: 2}, fs)
    assert [st.path for st in plan] == [f"{WEIGHTS_DIR}/node0", f"{WEIGHTS_DIR}/node1"]
    plan.execute(fs)
    assert {n: w for n, w in read_weights(fs).items() if n < 2} == {0: 5, 1: 2}
    # a write that fails (node 1's file made a link to nowhere) undoes the one before it
    (tree / WEIGHTS_DIR.lstrip("/") / "node1").unlink()
    (tree / WEIGHTS_DIR.lstrip("/") / "node1").symlink_to("missing/node1")
    with pytest.raises(PlanFailed, match="step 2"):
        weights_plan({0: 7, 1: 3}, fs).execute(fs)
    assert read_weights(fs)[0] == 5
    p = cli("numa", "--set-weights", "auto", sysroot=tree)
    assert p.returncode == 4 and "no auto weights (Linux 6.16+)" in p.stderr, p.stderr


def test_auto_weights_are_never_turned_off_silently() -> None:
    """On this host's own kernel, where it has the auto mode (Linux 6.16+): a dry run
    shows turning it off as a step of its own, and changes nothing."""
    fs = Sysfs()
    if read_weight_mode(fs) != "auto":
        pytest.skip("this host's kernel has no weighted-interleave auto mode switched on")
    auto = weights_auto_path(fs)
    before = (Path(fs.path(auto or "")).read_text(), read_weights(fs))
    node = min(read_weights(fs))
    env = {**os.environ}
    env.pop("PYCXL_SYSROOT", None)
    p = subprocess.run([sys.executable, "-m", "pycxl.cli.main", "numa", "--set-weights",
                        f"{node}=2", "--dry-run"], capture_output=True, text=True, env=env,
                       check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    first, second = p.stdout.splitlines()[1:3]
    assert f"{auto} <- 'false'" in first and "auto weights" in first
    assert f"node{node} <- '2'" in second
    assert (Path(fs.path(auto or "")).read_text(), read_weights(fs)) == before
