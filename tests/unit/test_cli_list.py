"""pycxl list through its real entry point, on recorded trees and on this machine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str, sysroot: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pycxl.cli.main", "list", *args]
    if sysroot is not None:
        cmd += ["--sysroot", str(sysroot)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def test_summary_names_tiers_and_absences(trees: Path) -> None:
    p = run(sysroot=trees / "two-dev/region")
    assert p.returncode == 0, p.stderr
    assert "cxl0" in p.stdout and "dram0" in p.stdout and "region0" in p.stdout
    assert "0:mem0 1:mem1" in p.stdout
    assert p.stderr == ""


def test_summary_json(trees: Path) -> None:
    p = run("--json", sysroot=trees / "two-dev/region")
    doc = json.loads(p.stdout)
    assert [m["memdev"] for m in doc["memdevs"]] == ["mem0", "mem1"]
    assert doc["regions"][0]["mappings"][1]["memdev"] == "mem1"
    assert [(n["name"], n["tier"]) for n in doc["numa_nodes"]] == [
        ("dram0", "dram"),
        ("cxl0", "cxl"),
    ]
    assert isinstance(doc["absent"], list) and p.stderr == ""


def test_no_cxl_still_shows_nodes(tmp_path: Path, trees: Path) -> None:
    shutil.copytree(trees / "two-dev/fresh/sys/devices/system", tmp_path / "sys/devices/system",
                    symlinks=True)  # fmt: skip
    p = run(sysroot=tmp_path)
    assert p.returncode == 0
    assert "no CXL bus: the CXL drivers are not loaded or there is no CXL hardware" in p.stdout
    assert "dram0" in p.stdout


def test_human_json(trees: Path) -> None:
    doc = json.loads(run("-R", "-u", "--json", sysroot=trees / "two-dev/region").stdout)
    assert doc[0]["size"] == "512.00 MiB (536.87 MB)" and doc[0]["resource"] == "0x110000000"


@pytest.mark.parametrize(
    ("flt", "memdevs"),
    [(["-m", "0x2"], ["mem1"]), (["-m", "0000:0d:00.0"], ["mem0"]),
     (["-m", "mem0,mem1"], ["mem0", "mem1"]), (["-r", "region0"], ["mem0", "mem1"]),
     (["-b", "ACPI.CXL"], ["mem0", "mem1"])],
)  # fmt: skip
def test_memdev_filters(trees: Path, flt: list[str], memdevs: list[str]) -> None:
    doc = json.loads(run("-M", *flt, "--json", sysroot=trees / "two-dev/region").stdout)
    assert [m["memdev"] for m in doc] == memdevs


def test_decoder_filter_by_kind_and_memdev(trees: Path) -> None:
    tree = trees / "two-dev/region"
    doc = json.loads(run("-D", "-d", "root", "--json", sysroot=tree).stdout)
    assert [d["decoder"] for d in doc] == ["decoder0.0"]
    doc = json.loads(run("-D", "-m", "0x1", "-d", "endpoint", "--json", sysroot=tree).stdout)
    assert [d["decoder"] for d in doc] == ["decoder2.0"]


@pytest.mark.parametrize(
    ("args", "key", "names"),
    [
        # as cxl list: a filter without a kind flag lists its own kind
        (["-d", "root"], "decoder", ["decoder0.0"]),
        (["-d", "decoder0.0"], "decoder", ["decoder0.0"]),
        (["-d", "0.0"], "decoder", ["decoder0.0"]),
        (["-m", "mem0"], "memdev", ["mem0"]),
        (["-m", "1"], "memdev", ["mem1"]),
        (["-s", "0x2"], "memdev", ["mem1"]),
        (["-r", "region0"], "region", ["region0"]),
        (["-r", "0"], "region", ["region0"]),
        (["-b", "root0"], "bus", ["root0"]),
        (["-b", "ACPI.CXL"], "bus", ["root0"]),
        (["-e", "endpoint2"], "endpoint", ["endpoint2"]),
        (["-p", "port1"], "port", ["port1"]),
    ],
)
def test_a_filter_implies_its_kind(trees: Path, args: list[str], key: str,
                                   names: list[str]) -> None:  # fmt: skip
    p = run(*args, "--json", sysroot=trees / "two-dev/region")
    assert p.returncode == 0, p.stderr
    assert [o[key] for o in json.loads(p.stdout)] == names


def test_two_filters_list_two_kinds_and_narrow_each_other(trees: Path) -> None:
    doc = json.loads(run("-m", "0x1", "-r", "region0", "--json",
                         sysroot=trees / "two-dev/region").stdout)  # fmt: skip
    assert [list(g) for g in doc] == [["memdevs"], ["regions"]]
    assert [m["memdev"] for m in doc[0]["memdevs"]] == ["mem0"]


def test_each_kind_has_one_json_schema(trees: Path) -> None:
    """The same keys for every object of a kind, whatever its state or level."""
    tree = trees / "two-dev/region"
    doc = json.loads(run("-BPEMDRXN", "-i", "--json", sysroot=tree).stdout)
    for group in doc:
        ((kind, objects),) = group.items()
        kind = "decoders" if kind.endswith("decoders") else kind
        shapes = {tuple(o) for o in objects}
        assert len(shapes) == 1, (kind, shapes)
        SCHEMAS.setdefault(kind, shapes.pop())
    keys = {k: set(v) for k, v in SCHEMAS.items()}
    assert {"decoder", "dpa_size", "pmem_capable", "nr_targets", "targets"} <= keys["decoders"]
    assert {"memdev", "ram_size", "serial", "numa_node", "state"} <= keys["memdevs"]
    assert {"node", "name", "tier", "region", "explicit", "distances"} <= keys["numa_nodes"]
    # -T fills the keys; it never adds them
    with_t = json.loads(run("-R", "-T", "--json", sysroot=tree).stdout)
    without = json.loads(run("-R", "--json", sysroot=tree).stdout)
    assert list(with_t[0]) == list(without[0]) and without[0]["mappings"] is None


SCHEMAS: dict[str, tuple[str, ...]] = {}


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [(["-m", "mem9"], 5, "unknown memdev 'mem9'; known: mem0, mem1"),
     (["-r", "region7"], 5, "unknown region 'region7'; known: region0"),
     (["-d", "decoder9.9"], 5, "unknown decoder 'decoder9.9'; known: decoder0.0"),
     (["-s", "0x99"], 5, "unknown memdev '0x99'"),
     (["--bogus"], 2, "No such option '--bogus'")],
)  # fmt: skip
def test_bad_filters_exit_codes(trees: Path, args: list[str], code: int, message: str) -> None:
    p = run(*args, sysroot=trees / "two-dev/region")
    assert p.returncode == code
    assert message in p.stderr and "Traceback" not in p.stderr
    assert p.stdout == ""


def test_every_table_flag_renders(trees: Path) -> None:
    p = run("-BPEMDRXNGT", "-i", sysroot=trees / "two-dev/region")
    assert p.returncode == 0, p.stderr
    for title in ("Buses", "Ports", "CXL memdevs", "Decoders", "Regions", "Dax devices",
                  "NUMA nodes", "GPUs"):  # fmt: skip
        assert title in p.stdout
    assert "dax0.0" in p.stdout and "4/4" in p.stdout


def test_live_machine_list() -> None:
    p = run()
    assert p.returncode == 0, p.stderr
    assert "dram0" in p.stdout
