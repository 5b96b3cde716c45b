"""Every command's exit codes are docs/cli.md's.

The table at the end of docs/cli.md and cli/exit_codes.py name the same codes; and every
command, in each situation of the table that it can meet on this machine (a bad option, a
named object or target that does not exist, no CXL on this host, not root), exits with
the code the table gives that situation. A command added without its situations here
fails the test, so the table cannot drift from a new command.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from pycxl.cli import exit_codes
from pycxl.cli.main import main

from tests.nobody import as_nobody
from tests.unit.test_fuzz import commands

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "tests" / "data" / "trees" / "two-dev" / "region"
HAS_CXL = os.path.isdir("/sys/bus/cxl/devices") and bool(os.listdir("/sys/bus/cxl/devices"))


def documented_codes() -> set[int]:
    """The codes in the first column of docs/cli.md's exit-code table."""
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("## Exit codes") :].split("\n\n")[1]
    codes: set[int] = set()
    for row in table.splitlines()[2:]:
        first = row.split("|")[1]
        codes |= {int(c) for c in re.findall(r"\b\d+\b(?![+])", first)}
    return codes


def test_the_docs_table_and_the_code_name_the_same_codes() -> None:
    in_code = {v for k, v in vars(exit_codes).items() if k.isupper() and isinstance(v, int)}
    assert in_code and in_code <= documented_codes(), in_code - documented_codes()


# Situation -> command -> the arguments that meet it. CXL objects that do not exist are
# named in a copy of a recorded two-memdev tree with one region (--sysroot is added);
# "{file}" is a small file.
PLAN_TRAIN = ["--layers", "2", "--hidden", "64", "--tokens", "8", "--hbm", "1G"]  # no GPU read
NOT_FOUND = {  # a named object or target that does not exist: 5
    ("list",): ["-m", "mem9"],
    ("memdev", "clear-media-poison"): ["mem9", "-a", "0x1000", "--dry-run"],
    ("memdev", "disable"): ["mem9", "--dry-run"],
    ("memdev", "enable"): ["mem9", "--dry-run"],
    ("memdev", "free-dpa"): ["mem9", "--dry-run"],
    ("memdev", "inject-media-poison"): ["mem9", "-a", "0x1000", "--dry-run"],
    ("memdev", "read-labels"): ["mem9"],
    ("memdev", "reserve-dpa"): ["mem9", "--dry-run"],
    ("memdev", "sanitize"): ["mem9", "--dry-run"],
    ("memdev", "set-alert-config"): ["mem9", "-L", "50", "--life-used-alert", "on", "--dry-run"],
    ("memdev", "set-partition"): ["mem9", "-s", "128M", "--dry-run"],
    ("memdev", "update-firmware"): ["mem9", "-F", "{file}", "--dry-run"],
    ("memdev", "wait-sanitize"): ["mem9"],
    ("memdev", "write-labels"): ["mem9", "-i", "{file}", "--dry-run"],
    ("memdev", "zero-labels"): ["mem9", "--dry-run"],
    ("port", "disable"): ["port9", "--dry-run"],
    ("port", "enable"): ["port9", "--dry-run"],
    ("port", "inject-protocol-error"): ["dport9", "-t", "cache-correctable", "--dry-run"],
    ("bus", "disable"): ["root9", "--dry-run"],
    ("region", "create"): ["mem9", "--dry-run"],
    ("region", "destroy"): ["region9", "--dry-run"],
    ("region", "disable"): ["region9", "--dry-run"],
    ("region", "enable"): ["region9", "--dry-run"],
    ("bench", "bandwidth"): ["-t", "node99"],
    ("bench", "first-touch"): ["-t", "node99"],
    ("bench", "latency"): ["-t", "node99"],
    ("bench", "loaded-latency"): ["-t", "node99"],
    ("bench", "transfer"): ["-g", "gpu99", "-t", "dram0"],
    ("bench", "offload"): ["-g", "gpu99"],
    ("pin-probe",): ["node99"],
    ("numa",): ["--tune-weights", "node99", "--dry-run"],
    ("run",): ["-m", "node99", "--", "true"],
    ("where",): ["999999999"],
    ("top",): ["-p", "999999999", "-c", "1"],
    ("spill",): ["node99", "{file}"],
    ("plan-train",): [*PLAN_TRAIN, "--tier", "node99"],
}
NO_CXL = {  # on a host without CXL, objects a CXL host has: 4
    ("memdev", "clear-media-poison"): ["mem0", "-a", "0x1000", "--dry-run"],
    ("memdev", "disable"): ["mem0", "--dry-run"],
    ("memdev", "enable"): ["mem0", "--dry-run"],
    ("memdev", "free-dpa"): ["mem0", "--dry-run"],
    ("memdev", "inject-media-poison"): ["mem0", "-a", "0x1000", "--dry-run"],
    ("memdev", "read-labels"): ["mem0"],
    ("memdev", "reserve-dpa"): ["mem0", "--dry-run"],
    ("memdev", "sanitize"): ["mem0", "--dry-run"],
    ("memdev", "set-alert-config"): ["mem0", "-L", "50", "--life-used-alert", "on", "--dry-run"],
    ("memdev", "set-partition"): ["mem0", "-s", "128M", "--dry-run"],
    ("memdev", "update-firmware"): ["mem0", "-F", "{file}", "--dry-run"],
    ("memdev", "wait-sanitize"): ["mem0"],
    ("memdev", "write-labels"): ["mem0", "-i", "{file}", "--dry-run"],
    ("memdev", "zero-labels"): ["mem0", "--dry-run"],
    ("port", "disable"): ["port1", "--dry-run"],
    ("port", "enable"): ["port1", "--dry-run"],
    ("port", "inject-protocol-error"): ["0000:0c:00.0", "-t", "cache-correctable", "--dry-run"],
    ("bus", "disable"): ["root0", "--dry-run"],
    ("bus", "enable"): ["--dry-run"],
    ("region", "create"): ["--dry-run"],
    ("region", "destroy"): ["region0", "--dry-run"],
    ("region", "disable"): ["region0", "--dry-run"],
    ("region", "enable"): ["region0", "--dry-run"],
    ("check",): ["-q", "--no-health"],
}
NEEDS_ROOT = {  # run as another user than root: 3
    ("numa",): ["--set-weights", "dram0=1"],
    ("where",): ["1"],
}
# Commands whose only situation here is a bad option (what else they meet needs a GPU, a
# kernel event or a testbed guest: their own tests hold those).
USAGE_ONLY = {("bench", "matrix"), ("labels",), ("monitor",), ("stat",), ("testbed",)}


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    base = tmp_path_factory.mktemp("exit-codes")
    shutil.copytree(TREE, base / "tree", symlinks=True)
    (base / "small.bin").write_bytes(b"\0" * 64)
    yield {"tree": str(base / "tree"), "file": str(base / "small.bin")}


CXL_COMMANDS = ("list", "memdev", "port", "bus", "region")


def _argv(path: tuple[str, ...], args: list[str], places: dict[str, str], *,
          tree: bool = False) -> list[str]:  # fmt: skip
    sysroot = ["--sysroot", places["tree"]] if tree and path[0] in CXL_COMMANDS else []
    return [*path, *(a.format(**places) for a in args), *sysroot]


def _exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def test_every_command_has_its_situations_here() -> None:
    covered = set(NOT_FOUND) | set(NO_CXL) | set(NEEDS_ROOT) | USAGE_ONLY
    assert set(commands()) == covered, set(commands()) ^ covered


@pytest.mark.parametrize("path", commands(), ids=" ".join)
def test_a_bad_option_is_a_usage_error(path: tuple[str, ...],
                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code, err = _exit([*path, "--no-such-option"], capsys)
    assert code == exit_codes.USAGE and "--no-such-option" in err, err


@pytest.mark.parametrize("path", sorted(NOT_FOUND), ids=" ".join)
def test_what_does_not_exist_is_not_found(path: tuple[str, ...], places: dict[str, str],
                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code, err = _exit(_argv(path, NOT_FOUND[path], places, tree=True), capsys)
    assert code == exit_codes.NOT_FOUND and err.startswith("pycxl: error: unknown"), (code, err)
    assert re.search(r"known|there is no|no process", err), err  # what does exist, or none


@pytest.mark.skipif(HAS_CXL, reason="this host has CXL")
@pytest.mark.parametrize("path", sorted(NO_CXL), ids=" ".join)
def test_without_cxl_device_commands_say_it_is_absent(
    path: tuple[str, ...], places: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _exit(_argv(path, NO_CXL[path], places), capsys)
    assert code == exit_codes.NOT_AVAILABLE, (code, err)
    if path != ("check",):  # check says it in its findings, on standard output
        assert "CXL" in err and err.count("\n") == 1, err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
@pytest.mark.parametrize("path", sorted(NEEDS_ROOT), ids=" ".join)
def test_what_needs_root_says_so_before_it_writes(path: tuple[str, ...],
                                                  places: dict[str, str]) -> None:  # fmt: skip
    weights = "/sys/kernel/mm/mempolicy/weighted_interleave"
    if path == ("numa",) and not os.path.isdir(weights):
        pytest.skip("this kernel has no weighted interleave")
    before = sorted(os.listdir(weights)) if os.path.isdir(weights) else []
    values = [Path(weights, n).read_text() for n in before]
    p = as_nobody(_argv(path, NEEDS_ROOT[path], places))
    assert p.returncode == exit_codes.NEEDS_ROOT, (p.returncode, p.stderr)
    assert "root" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert [Path(weights, n).read_text() for n in before] == values
