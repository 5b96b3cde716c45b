"""Two sockets on the real kernel (testbed topology two-socket): what the kernel makes of
the firmware's HMAT and the devices' CDAT, each node's nearest socket, a region on each
socket and one across both as the windows decide, advertised figures beside measured
ones, and weighted-interleave weights from measurement with the pages that follow them.

The figures the emulated firmware advertises are the topology's own (pycxl.testbed.
topologies): the tests check that the kernel passes them on and pycxl reads them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import pycxl
from pycxl import bench
from pycxl.base.sysfs import parse_cpulist
from pycxl.base.units import parse_size
from pycxl.numa.access import cpu_figures
from pycxl.numa.policy import read_weight_mode, read_weights, write_weights
from pycxl.numa.weights import weights_from_bandwidth
from pycxl.pci.devices import PCI_DEVICES, device_numa_node
from pycxl.resolve.system import System, snapshot
from pycxl.resolve.tiers import NodeTier
from pycxl.testbed.topologies import SOCKET_DISTANCE, TOPOLOGIES, Figure
from tests.kernel.kernel_helpers import REPO, cxl_state, pycxl_cli, state_diff

TOPO = TOPOLOGIES["two-socket"]
HMAT = TOPO.hmat
assert HMAT is not None
SIZE = 256 << 10
PCI_TESTDEV = ("0x1b36", "0x0005")  # QEMU's pci-testdev: the stand-in for a GPU
# movable: the kernel keeps its own allocations out, so each test can destroy its regions
MOVABLE = ("--zone", "movable")


def _figures(f: Figure) -> tuple[int, int]:
    """(latency ns, bytes/s) as the topology gives them to QEMU's HMAT."""
    return f.latency_ns, parse_size(f.bandwidth)


def _window(*sockets: int) -> str:
    """The root decoder whose window interleaves exactly these sockets' host bridges."""
    hosts = [f"pci0000:{b.bus_nr:02x}" for s in sockets for b in TOPO.bridges if b.socket == s]
    topo = snapshot(gpus=False).cxl
    return next(d.name for d in topo.root_decoders() if [t.name for t in d.targets] == hosts)


def _serials(socket: int) -> list[str]:
    return [hex(sn) for b in TOPO.bridges if b.socket == socket for sn in b.serials]


def _json(*args: str) -> object:
    p = pycxl_cli(*args, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _tiers(s: System) -> dict[str, NodeTier]:
    return {t.name: t for t in s.nodes}


@pytest.mark.kernel(topology="two-socket")
def test_sockets_and_what_the_firmware_advertises() -> None:
    s = snapshot(gpus=False)
    tiers = _tiers(s)
    assert [n for n, t in tiers.items() if t.tier == "dram"] == ["dram0", "dram1"]
    for i, name in enumerate(("dram0", "dram1")):
        t = tiers[name]
        assert t.node.cpus == parse_cpulist(TOPO.sockets[i].cpus)
        assert (t.near, t.near_by) == (t.node.id, "self")
        # HMAT: each socket's DRAM, for its own CPUs (the kernel links the best initiator)
        adv = t.node.advertised
        assert adv is not None and adv.initiators == (t.node.id,), adv
        assert (adv.read_latency_ns, adv.read_bytes_per_s) == _figures(HMAT.dram_local)
        assert (adv.write_latency_ns, adv.write_bytes_per_s) == _figures(HMAT.dram_local)
    assert tiers["dram0"].node.distances[tiers["dram1"].node.id] == SOCKET_DISTANCE

    # each memdev hangs off its host bridge's socket
    for b in TOPO.bridges:
        for sn in b.serials:
            assert s.cxl.find_memdev(hex(sn)).numa_node == b.socket

    # the PCIe device standing in for a GPU: its socket, and that socket's tiers
    (dev,) = [d for d in sorted(os.listdir(PCI_DEVICES))
              if tuple(Path(PCI_DEVICES, d, a).read_text().strip()
                       for a in ("vendor", "device")) == PCI_TESTDEV]  # fmt: skip
    node = device_numa_node(dev)
    assert node == TOPO.pcie[0].socket
    assert [t.name for t in s.near_tiers(node)] == ["dram1"]

    # Linux 6.12: a weight for every possible node, and no auto mode (6.16+)
    assert read_weight_mode() == "manual"
    assert set(read_weights()) >= {t.node.id for t in s.nodes}

    # the CLI says the same
    nodes = {n["name"]: n for n in _json("numa")}  # type: ignore[union-attr]
    assert nodes["dram1"]["advertised"]["read_latency_ns"] == HMAT.dram_local.latency_ns
    assert nodes["dram1"]["near_node"] == tiers["dram1"].node.id
    assert {n["weight_mode"] for n in nodes.values()} == {"manual"}
    p = pycxl_cli("numa")
    assert "advertised" in p.stdout and "weights: manual" in p.stdout, p.stdout


@pytest.mark.kernel(topology="two-socket")
def test_a_region_on_each_socket_is_nearest_its_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    a = _json("region", "create", *MOVABLE, "-d", _window(0), *_serials(0))
    b = _json("region", "create", *MOVABLE, "-d", _window(1), _serials(1)[0])
    assert isinstance(a, dict) and isinstance(b, dict)
    assert (a["tier"], b["tier"]) == ("cxl0", "cxl1")
    assert (a["memdev_nodes"], b["memdev_nodes"]) == ([0], [1])
    s = snapshot(gpus=False)
    tiers = _tiers(s)
    cxl0, cxl1 = tiers["cxl0"], tiers["cxl1"]
    dram0, dram1 = tiers["dram0"].node.id, tiers["dram1"].node.id
    # the kernel gives a CXL node one distance to every node: the socket comes from
    # where its memdevs hang off
    assert cxl1.node.distances[dram0] == cxl1.node.distances[dram1]
    assert (cxl0.near, cxl0.near_by) == (dram0, "memdevs")
    assert (cxl1.near, cxl1.near_by) == (dram1, "memdevs")
    assert [t.name for t in s.near_tiers(dram1)] == ["dram1", "cxl1"]

    # the regions' figures (HMAT to the host bridge, plus the devices' CDAT); the node's
    # are the region's, with no initiator named; bandwidth adds up over the ways
    ra, rb = s.cxl.region(str(a["region"])), s.cxl.region(str(b["region"]))
    fa, fb = cxl0.node.advertised, cxl1.node.advertised
    assert fa is not None and fb is not None and fa.initiators == fb.initiators == ()
    assert fa == cpu_figures(ra.access) and fb == cpu_figures(rb.access)
    assert fa.read_bytes_per_s == 2 * fb.read_bytes_per_s  # type: ignore[operator]
    assert fa.read_latency_ns == fb.read_latency_ns > HMAT.port_local.latency_ns

    # benchmarks run from the nearest socket, with the advertised figure beside them
    (lat,) = bench.measure_latency("cxl1", size=SIZE, samples=2, loads=1 << 14)
    assert lat.initiator == "dram1" and set(lat.cpus) == set(tiers["dram1"].node.cpus)
    assert lat.pages_on_node == lat.pages and lat.advertised_latency_ns == fb.read_latency_ns
    assert lat.advertised_factor is not None and lat.advertised_factor >= 1.0
    (far,) = bench.measure_latency("cxl1", "dram0", size=SIZE, samples=2, loads=1 << 14)
    assert far.advertised_latency_ns is None  # nothing is advertised from the far socket
    (bw,) = bench.measure_bandwidth("cxl0", size=SIZE, samples=1, kernel="triad")
    assert bw.initiator == "dram0" and bw.advertised_bytes_per_s == fa.read_bytes_per_s
    p = pycxl_cli("bench", "latency", "-t", "cxl1", "--size", "256K", "-n", "2")
    assert p.returncode == 0 and "advertised" in p.stdout, p.stderr

    # the matrix: a row per socket, a column per tier, each row's own CPUs
    monkeypatch.setenv("PYCXL_BENCH_QUICK", "1")
    cells = _json("bench", "matrix", "--no-gpus", "--size", "256K")
    assert isinstance(cells, list)
    assert {(c["initiator"], c["target"]) for c in cells} == {
        (i, t) for i in ("dram0", "dram1") for t in ("dram0", "dram1", "cxl0", "cxl1")
    }
    for c in cells:
        assert set(c["cpus"]) == set(tiers[c["initiator"]].node.cpus), c
        near = tiers[c["target"]].near == tiers[c["initiator"]].node.id
        assert (c["advertised_latency_ns"] is not None) == near, c

    # list and check see each region on its socket
    regions = {r["region"]: r for r in _json("list", "-R")}  # type: ignore[union-attr]
    assert regions[a["region"]]["memdev_nodes"] == [0]
    assert regions[b["region"]]["advertised"]["read_bytes_per_s"] == fb.read_bytes_per_s
    p = pycxl_cli("list", "-R")
    assert "memdevs on" in p.stdout and "dram1" in p.stdout, p.stdout
    p = pycxl_cli("check", "--json")
    doc = json.loads(p.stdout)
    assert not [f for f in doc["findings"] if f["check"] == "region-sockets"]


@pytest.mark.kernel(topology="two-socket")
def test_a_region_across_sockets_as_the_windows_decide() -> None:
    before = cxl_state()
    across = [_serials(0)[1], _serials(1)[1]]
    # a window on one socket's bridge cannot reach the other socket's memdev
    p = pycxl_cli("region", "create", "-d", _window(0), *across)
    assert p.returncode == 2, p.stderr
    assert "which root decoder" in p.stderr and "memdevs on two sockets (nodes 0, 1)" in p.stderr
    assert state_diff(before, cxl_state()) == []
    # the window over both bridges allows it
    r = _json("region", "create", *MOVABLE, "-d", _window(0, 1), *across)
    assert isinstance(r, dict) and r["memdev_nodes"] == [0, 1] and r["interleave_ways"] == 2
    s = snapshot(gpus=False)
    t = _tiers(s)[str(r["tier"])]
    # no socket is nearer than the other: the first, by distance
    assert (t.near, t.near_by) == (_tiers(s)["dram0"].node.id, "distance")
    doc = json.loads(pycxl_cli("check", "--json").stdout)
    (f,) = [f for f in doc["findings"] if f["check"] == "region-sockets"]
    assert f["severity"] == "info" and f["labels"]["sockets"] == "dram0, dram1", f
    # a port's decoders go in address order: socket 1's bridge now decodes the region
    # above window 1, so window 1 is refused, before any write (the kernel says EBUSY)
    mid = cxl_state()
    p = pycxl_cli("region", "create", "-d", _window(1), _serials(1)[0])
    assert p.returncode == 2 and "address order" in p.stderr, p.stderr
    assert state_diff(mid, cxl_state()) == []
    pycxl.destroy_region(str(r["region"]))
    r = _json("region", "create", *MOVABLE, "-d", _window(1), _serials(1)[0])  # now it fits
    pycxl.destroy_region(str(r["region"]))  # type: ignore[index]
    assert state_diff(before, cxl_state()) == []


@pytest.mark.kernel(topology="two-socket")
def test_weights_from_measurement_and_the_pages_that_follow_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYCXL_BENCH_QUICK", "1")
    r = _json("region", "create", *MOVABLE, "-d", _window(0), _serials(0)[0])
    assert isinstance(r, dict) and r["tier"] == "cxl0"
    s = snapshot(gpus=False)
    dram, cxl = s.resolve("dram0").node, s.resolve("cxl0").node
    assert dram is not None and cxl is not None
    before = read_weights()

    plan = _json("numa", "--tune-weights", "dram0,cxl0", "--from", "dram0", "--dry-run")
    assert isinstance(plan, dict) and plan["dry_run"] and read_weights() == before
    assert plan["mode"] == "manual" and not plan["turns_auto_off"]

    tuned = _json("numa", "--tune-weights", "dram0,cxl0", "--from", "dram0")
    assert isinstance(tuned, dict) and not tuned["dry_run"]
    tiers = {t["name"]: t for t in tuned["tiers"]}
    measured = {tiers[n]["node"]: tiers[n]["bytes_per_s"] for n in ("dram0", "cxl0")}
    weights = {tiers[n]["node"]: tiers[n]["weight"] for n in ("dram0", "cxl0")}
    assert weights == weights_from_bandwidth(measured)  # the rule the output states
    assert {n: read_weights()[n] for n in weights} == weights  # and the kernel has them
    assert measured[dram] > measured[cxl]  # emulated CXL is far slower than DRAM here
    assert tiers["cxl0"]["advertised_bytes_per_s"] is not None

    # pycxl run -w: a program's fresh pages land by the weights, within one page per
    # weight unit (the round may start anywhere)
    try:
        p = pycxl_cli("run", "-w", "dram0,cxl0", "--", sys.executable,
                      os.path.join(REPO, "tests", "kernel", "page_nodes.py"), "4")  # fmt: skip
        assert p.returncode == 0, p.stderr
        counts = {int(k): v for k, v in json.loads(p.stdout).items()}
        pages, total = sum(counts.values()), sum(weights.values())
        assert pages == 4 * (1 << 20) // 4096 and set(counts) <= set(weights), counts
        for node, w in weights.items():
            assert abs(counts.get(node, 0) - pages * w / total) <= w, (counts, weights)
        # the undo the command printed puts the old weights back
        p = pycxl_cli("numa", "--set-weights", tuned["undo"])
        assert p.returncode == 0, p.stderr
        assert read_weights() == before
    finally:
        write_weights({n: before[n] for n in weights})
        pycxl.destroy_region(str(r["region"]))
