"""Regions across two host bridges on the real kernel: 4-way from memdevs typed in a
scrambled order, 2-way through the window of one bridge, and two racing creators."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pycxl.cxl.sysfs_backend import read_topology
from tests.kernel.kernel_helpers import cxl_state, ndctl, pages_by_node, pycxl_cli, state_diff

MiB = 1 << 20


def _create(*args: str) -> dict[str, object]:
    p = pycxl_cli("region", "create", *args, "--zone", "movable", "--json")
    assert p.returncode == 0, p.stderr
    doc: dict[str, object] = json.loads(p.stdout)
    return doc


def _positions_follow_the_decode_path(name: str) -> list[int]:
    """Serials by position, after checking each position routes as the hardware decodes."""
    topo = read_topology()
    region = topo.region(name)
    root = topo.decoder(region.decoder)
    root_targets = [d.name for d in root.targets]
    serials = []
    for m in sorted(region.mappings, key=lambda m: m.position):
        memdev = topo.memdev(str(m.memdev))
        assert memdev.endpoint is not None
        hb = memdev.endpoint.route[0][1]
        assert hb == root_targets[m.position % len(root_targets)], (m, root_targets)
        serials.append(int(memdev.serial or 0))
    return serials


@pytest.mark.kernel(topology="four-dev")
def test_four_way_across_bridges_from_a_scrambled_order() -> None:
    first = cxl_state()
    doc = _create("0x22", "0x11", "0x21", "0x12")
    name, node = str(doc["region"]), doc["numa_node"]
    assert doc["interleave_ways"] == 4 and doc["size"] == 1024 * MiB and doc["tier"] == "cxl0"
    serials = _positions_follow_the_decode_path(name)
    assert sorted(serials) == [0x11, 0x12, 0x21, 0x22]
    # ndctl reads the same mappings at the same positions
    (theirs,) = ndctl("-R", "-T", "-r", name)
    ours = {m["position"]: m["memdev"] for m in doc["mappings"]}  # type: ignore[attr-defined]
    assert {m["position"]: m["memdev"] for m in theirs["mappings"]} == ours
    assert pages_by_node(2, f"--membind={node}") == {node: 2 * MiB // 4096}
    p = pycxl_cli("region", "destroy", name)
    assert p.returncode == 0, p.stderr
    assert state_diff(first, cxl_state()) == []


@pytest.mark.kernel(topology="four-dev")
def test_two_way_on_one_bridge_uses_its_own_window() -> None:
    first = cxl_state()
    doc = _create("0x12", "0x11")
    name = str(doc["region"])
    assert doc["layout"]["decoder"] == "decoder0.1" and doc["interleave_ways"] == 2  # type: ignore[index]
    assert sorted(_positions_follow_the_decode_path(name)) == [0x11, 0x12]
    assert doc["tier"] == "cxl0"
    # the other bridge's pair has no window of its own: window 0 needs a memdev under
    # each bridge, window 1 does not reach bridge 222; refused, saying so
    p = pycxl_cli("region", "create", "0x21", "0x22")
    assert p.returncode == 2 and "none sit under pci0000:0c" in p.stderr, p.stderr
    assert "decoder0.1: memdev" in p.stderr and "does not reach" in p.stderr
    assert pycxl_cli("region", "destroy", name).returncode == 0
    assert state_diff(first, cxl_state()) == []


@pytest.mark.kernel(topology="four-dev")
def test_two_creators_racing_for_one_root_decoder() -> None:
    first = cxl_state()
    cmd = [sys.executable, "-m", "pycxl.cli.main", "region", "create", "-d", "decoder0.0",
           "--no-online", "--json"]  # fmt: skip
    procs = [
        subprocess.Popen([*cmd, *pair], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for pair in (["0x11", "0x21"], ["0x12", "0x22"])
    ]
    outs = [(p.wait(), *p.communicate()) for p in procs]
    # the loser of each EBUSY handshake undoes and re-plans: both end with a region
    assert [rc for rc, _, _ in outs] == [0, 0], [err for _, _, err in outs]
    created = [str(json.loads(out)["region"]) for _, out, _ in outs]
    assert len(set(created)) == 2
    topo = read_topology()
    assert sorted(r.name for r in topo.regions) == sorted(created)
    assert all(r.committed and len(r.mappings) == 2 for r in topo.regions)
    for name in created:
        _positions_follow_the_decode_path(name)
        assert pycxl_cli("region", "destroy", name).returncode == 0
    assert state_diff(first, cxl_state()) == []
