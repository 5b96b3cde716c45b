"""Region layout and validation on trees recorded from the real kernel (nothing written)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from pycxl.base.errors import InvalidRequestError, NotFoundError
from pycxl.base.sysfs import Sysfs
from pycxl.cxl.region_layout import RegionRequest, free_capacity, layout_region
from pycxl.cxl.sysfs_backend import read_topology
from pycxl.cxl.topology import CxlTopology
from tests.kernel.kernel_helpers import pycxl_cli

MiB = 1 << 20


def topo(trees: Path, name: str) -> CxlTopology:
    return read_topology(Sysfs(trees / name))


def serials(layout_targets: object) -> list[int]:
    return [t.memdev.serial for t in layout_targets]  # type: ignore[attr-defined]


def test_default_two_way_on_two_dev(trees: Path) -> None:
    lay = layout_region(topo(trees, "two-dev/fresh"), RegionRequest(ways=2))
    assert (lay.root.name, lay.type, lay.ways, lay.size) == ("decoder0.0", "ram", 2, 512 * MiB)
    assert lay.granularity == lay.root.interleave_granularity
    assert sorted(serials(lay.targets)) == [0x1, 0x2]
    assert all(t.decoder.kind == "endpoint" and t.decoder.dpa_size == 0 for t in lay.targets)


@pytest.mark.parametrize(
    "order", [("0x22", "0x11", "0x21", "0x12"), ("0x11", "0x12", "0x21", "0x22"),
              ("0x21", "0x22", "0x12", "0x11")],
)  # fmt: skip
def test_four_way_positions_follow_the_decode_path(trees: Path, order: tuple[str, ...]) -> None:
    t = topo(trees, "four-dev/fresh")
    lay = layout_region(t, RegionRequest(memdevs=order))
    root_targets = [d.name for d in lay.root.targets]
    assert lay.root.name == "decoder0.0" and len(root_targets) == 2
    for tgt in lay.targets:
        ep = tgt.memdev.endpoint
        assert ep is not None
        route = [dport for _port, dport in ep.route]
        # position p sits under root target p mod 2, and within its host bridge
        # the two positions p and p+2 use different root ports
        assert route[0] == root_targets[tgt.position % 2]
    by_pos = {t.position: t.memdev.endpoint.route[1][1] for t in lay.targets}  # type: ignore[union-attr]
    assert by_pos[0] != by_pos[2] and by_pos[1] != by_pos[3]
    # whatever order the user typed, the same layout
    again = layout_region(t, RegionRequest(memdevs=("0x11", "0x21", "0x12", "0x22")))
    assert serials(lay.targets) == serials(again.targets)


def test_two_way_on_one_bridge_picks_the_window_of_that_bridge(trees: Path) -> None:
    lay = layout_region(topo(trees, "four-dev/fresh"), RegionRequest(memdevs=("0x12", "0x11")))
    assert lay.root.name == "decoder0.1" and [d.name for d in lay.root.targets] == ["pci0000:0c"]
    assert sorted(serials(lay.targets)) == [0x11, 0x12]


def test_memdevs_by_name_serial_and_host(trees: Path) -> None:
    t = topo(trees, "two-dev/fresh")
    m0, m1 = t.memdevs
    lay = layout_region(t, RegionRequest(memdevs=(m1.host, f"{m0.serial:#x}")))
    assert {x.memdev.name for x in lay.targets} == {m0.name, m1.name}


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (RegionRequest(ways=5), r"interleave ways 5 is not one CXL supports"),
        (RegionRequest(ways=2, granularity=1000), r"granularity 1000 is not a power of two"),
        (RegionRequest(ways=2, granularity=32768), r"granularity 32768 is not a power of two"),
        (RegionRequest(ways=2, size=256 * MiB), r"not a multiple of 256 MiB x 2 ways"),
        (
            RegionRequest(ways=2, size=1024 * MiB),
            r"have 512.00 MiB of free ram capacity.*mem0 \(256.00 MiB free\)",
        ),
        (RegionRequest(memdevs=("0x1",), ways=2), r"1 memdev\(s\) named for a 2-way region"),
        (RegionRequest(memdevs=("0x1", "mem0", "0x2")), None),
        (RegionRequest(memdevs=("0x1", "0x1")), r"named twice"),
        (RegionRequest(ways=2, type="pmem"), r"0 B free"),
        (RegionRequest(ways=2, uuid="abc"), r"--uuid applies to pmem regions only"),
        (
            RegionRequest(ways=2, decoder="decoder2.0"),
            r"decoder2.0 is an endpoint decoder of endpoint2, not a root decoder",
        ),
    ],
)
def test_rejections_name_the_problem(trees: Path, req: RegionRequest, message: str | None) -> None:
    t = topo(trees, "two-dev/fresh")
    if message is None:  # duplicate through two spellings of one memdev (0x1 vs its name)
        m = t.find_memdev("0x1")
        req = RegionRequest(memdevs=("0x1", m.name))
        message = f"memdev {m.name} is named twice"
    with pytest.raises(InvalidRequestError, match=message):
        layout_region(t, req)


def test_unknown_names(trees: Path) -> None:
    t = topo(trees, "two-dev/fresh")
    with pytest.raises(NotFoundError, match=r"unknown memdev 'mem9'; known: mem0, mem1"):
        layout_region(t, RegionRequest(memdevs=("mem9", "mem0")))
    with pytest.raises(
        NotFoundError, match=r"unknown root decoder 'decoder7.0'; known: decoder0.0"
    ):
        layout_region(t, RegionRequest(ways=2, decoder="decoder7.0"))


def test_cross_bridge_pair_rejected_on_single_bridge_window(trees: Path) -> None:
    with pytest.raises(InvalidRequestError, match=r"which root decoder decoder0.1 does not reach"):
        layout_region(
            topo(trees, "four-dev/fresh"),
            RegionRequest(memdevs=("0x11", "0x21"), decoder="decoder0.1"),
        )
    # a 2-way region cannot use both root ports of one bridge through the 2-bridge window
    with pytest.raises(InvalidRequestError, match=r"none sit under pci0000:de"):
        layout_region(
            topo(trees, "four-dev/fresh"),
            RegionRequest(memdevs=("0x11", "0x12"), decoder="decoder0.0"),
        )


def test_mapped_memdevs_are_refused_with_the_region_that_holds_them(trees: Path) -> None:
    t = topo(trees, "two-dev/region")
    assert all(free_capacity(m, "ram") == 0 for m in t.memdevs)
    with pytest.raises(InvalidRequestError, match=r"already mapped by region0"):
        layout_region(t, RegionRequest(memdevs=("0x1", "0x2")))
    with pytest.raises(InvalidRequestError, match=r"mem0 \(0 B free, in region0\)"):
        layout_region(t, RegionRequest(ways=2))


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for f in sorted(filenames):
            p = Path(dirpath) / f
            if not p.is_symlink():
                h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def test_cli_dry_run_shows_the_plan_and_writes_nothing(trees: Path) -> None:
    tree = trees / "four-dev/fresh"
    before = _digest(tree)
    p = pycxl_cli("region", "create", "0x22", "0x11", "0x21", "0x12", "--dry-run",
                  "--sysroot", str(tree))  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "dry run: nothing written" in p.stdout and "4-way at 4096 B" in p.stdout
    assert "/sys/bus/cxl/devices/region0/commit <- '1'" in p.stdout
    assert "/sys/bus/cxl/drivers/cxl_region/bind <- 'region0'" in p.stdout
    p = pycxl_cli("region", "create", "-w", "3", "--sysroot", str(tree))
    assert p.returncode == 2 and "interleave ways 3" not in p.stdout
    assert "no root decoder can host a 3-way" in p.stderr or "interleave" in p.stderr
    assert _digest(tree) == before


def test_cli_dry_run_json_and_teardown_plans(trees: Path) -> None:
    import json

    tree = str(trees / "two-dev/region")
    p = pycxl_cli("region", "destroy", "region0", "--dry-run", "--json", "--sysroot", tree)
    (doc,) = json.loads(p.stdout)  # destroy prints a list, whatever the count
    assert doc["dry_run"] and doc["action"] == "destroy"
    paths = [s["path"] for s in doc["plan"]]
    assert paths[0] is None and "offline dax0.0" in doc["plan"][0]["description"]
    assert paths[1:3] == [
        "/sys/bus/cxl/drivers/cxl_region/unbind",
        "/sys/bus/cxl/devices/region0/commit",
    ]
    assert paths[-1] == "/sys/bus/cxl/devices/decoder0.0/delete_region"
    p = pycxl_cli("region", "destroy", "region7", "--sysroot", tree)
    assert p.returncode == 5 and "unknown region 'region7'; known: region0" in p.stderr
