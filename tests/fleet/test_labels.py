"""``pycxl labels``: the same facts as Slurm node attributes and as a
node-feature-discovery feature file, read back by that format's rules
(tests/fleet/nfd_format.py, from node-feature-discovery's own parser and validation) on
recorded trees, on an edited one and on this host; the bad input it refuses."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fleet import nfd_format
from tests.fleet.trees import FRESH, REGION

NS = "feature.node.kubernetes.io"


def _labels(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycxl.cli.main", "labels", *args],
                          capture_output=True, text=True, check=False)  # fmt: skip


def _movable(tmp_path: Path) -> Path:
    """The region tree with region0's memory in the movable zone (edited: GPU pins
    would be moved off it)."""
    import shutil

    tree = tmp_path / "movable"
    shutil.copytree(REGION, tree, symlinks=True)
    for block in range(34, 38):  # region0's four memory blocks
        (tree / f"sys/devices/system/memory/memory{block}/valid_zones").write_text("Movable\n")
    return tree


def test_slurm_attributes_name_the_capacity_online(tmp_path: Path) -> None:
    p = _labels("--format", "slurm", "--sysroot", str(REGION))
    assert (p.returncode, p.stdout) == (0, "Features=cxl,cxl_gib:0,cxl_pinnable "
                                           "Gres=cxl_mem:no_consume:512M\n"), p.stderr  # fmt: skip
    p = _labels("--format", "slurm", "--sysroot", str(_movable(tmp_path)))
    assert p.stdout == "Features=cxl,cxl_gib:0 Gres=cxl_mem:no_consume:512M\n"
    # memdevs without a region: no CXL memory online, nothing to add to the node line
    p = _labels("--format", "slurm", "--sysroot", str(FRESH))
    assert (p.returncode, p.stdout) == (0, "\n")


def test_the_feature_file_reads_back_as_node_feature_discovery_reads_it(tmp_path: Path) -> None:
    features = tmp_path / "features.d"
    features.mkdir()
    out = features / "pycxl"
    before = datetime.datetime.now(datetime.UTC)
    p = _labels("--format", "nfd", "--ttl", "600", "--output", str(out), "--sysroot", str(REGION))
    assert p.returncode == 0 and p.stdout == "", p.stderr
    assert [f.name for f in features.iterdir()] == ["pycxl"]  # no temporary left behind
    labels, errors = nfd_format.read(out, before)
    assert errors == []
    assert labels == {
        f"{NS}/memory-tier.dram": "true",
        f"{NS}/memory-tier.cxl": "true",
        f"{NS}/memory-cxl.memdevs": "2",
        f"{NS}/memory-cxl.nodes": "1",
        f"{NS}/memory-cxl.gib": "0",
        f"{NS}/memory-cxl.gpu-pinning": "true",
        f"{NS}/memory-cxl.health": "ok",
    }
    assert [pr for k, v in labels.items() for pr in nfd_format.label_problems(k, v)] == []
    # they expire 600 s after writing, unless written again
    assert nfd_format.read(out, before + datetime.timedelta(seconds=590))[0] == labels
    assert nfd_format.read(out, before + datetime.timedelta(seconds=700))[0] == {}
    # the same facts as JSON, with both renderings
    doc = json.loads(_labels("--format", "json", "--sysroot", str(REGION)).stdout)
    assert doc["nfd"] == labels and doc["cxl_bytes"] == 512 << 20
    assert doc["slurm"] == "Features=cxl,cxl_gib:0,cxl_pinnable Gres=cxl_mem:no_consume:512M"


@pytest.mark.parametrize("tree", ["fresh", "movable", "host"])
def test_every_label_is_valid_wherever_it_is_made(tmp_path: Path, tree: str) -> None:
    args = {"fresh": ["--sysroot", str(FRESH)], "movable": ["--sysroot", str(_movable(tmp_path))],
            "host": []}[tree]  # fmt: skip
    out = tmp_path / "pycxl"
    p = _labels("--format", "nfd", "-o", str(out), *args)
    assert p.returncode == 0, p.stderr
    labels, errors = nfd_format.read(out, datetime.datetime.now(datetime.UTC))
    assert errors == [] and labels
    assert [pr for k, v in labels.items() for pr in nfd_format.label_problems(k, v)] == []
    expect = {"fresh": ("0", "warning", None), "movable": ("1", "ok", "false"),
              "host": ("0", None, None)}[tree]  # fmt: skip
    assert labels[f"{NS}/memory-cxl.nodes"] == expect[0]
    if expect[1]:
        assert labels[f"{NS}/memory-cxl.health"] == expect[1]
    assert labels.get(f"{NS}/memory-cxl.gpu-pinning") == expect[2]


def test_the_format_rules_catch_what_node_feature_discovery_refuses(tmp_path: Path) -> None:
    assert nfd_format.label_problems("memory-cxl", "true")  # no namespace
    assert nfd_format.label_problems("kubernetes.io/memory", "true")  # denied namespace
    assert nfd_format.label_problems(f"{NS}/memory cxl", "true")  # a space in the name
    assert nfd_format.label_problems(f"{NS}/gib", "1,024")  # a comma in the value
    assert nfd_format.label_problems(f"{NS}/gib", "x" * 64)  # too long
    assert nfd_format.label_problems(f"sub.{NS}/gib", "1") == []
    hidden = tmp_path / ".pycxl"
    hidden.write_text(f"{NS}/x=1\n")
    assert nfd_format.read(hidden, datetime.datetime.now(datetime.UTC))[0] == {}
    big = tmp_path / "big"
    big.write_text(f"{NS}/x=1\n" * 5000)
    assert nfd_format.read(big, datetime.datetime.now(datetime.UTC))[0] == {}


def test_bad_input_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    cases = [
        (["--format", "nfd", "-o", str(tmp_path / ".pycxl")], "skips hidden files"),
        (["--format", "nfd", "-o", str(tmp_path / "no" / "pycxl")], "does not exist"),
        (["--format", "nfd", "-o", str(tmp_path)], "is a directory"),
        (["--format", "slurm", "--ttl", "60"], "--ttl applies to --format nfd"),
        (["--format", "nfd", "--ttl", "0"], "--ttl': ttl must be at least 1, not 0"),
        (["--format", "yaml"], "'yaml' is not one of"),
        ([], "Missing option '-F' / '--format'"),
    ]
    for args, words in cases:
        p = _labels(*args)
        assert p.returncode == 2 and words in p.stderr, (args, p.stderr)
        assert "Traceback" not in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_gres_counts_use_the_largest_exact_binary_suffix() -> None:
    from pycxl.ops.labels import slurm_count

    sizes = {512 << 30: "512G", 3 << 29: "1536M", 1 << 40: "1T", 4097: "4097", 0: "0"}
    assert {size: slurm_count(size) for size in sizes} == sizes
