"""What writes a recorded tree is what docs/cli.md says: every command that takes
--sysroot is run, without --dry-run and with something to do, against its own copy of a
recorded tree, and the commands that changed their copy are the documented list."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.test_fuzz import command, commands, run_in_child

ROOT = Path(__file__).resolve().parents[2]
TREES = ROOT / "tests" / "data" / "trees"
DOCS = ROOT / "docs" / "cli.md"


def _device(tree: Path, name: str) -> Path:
    """The folder a /sys/bus/cxl/devices link of the tree leads to."""
    return (tree / "sys" / "bus" / "cxl" / "devices" / name).resolve()


def _unbind(name: str) -> Callable[[Path], None]:
    """The tree as if ``name`` had no driver: something for 'enable' to do."""
    return lambda tree: (_device(tree, name) / "driver").unlink()


def _files(files: dict[str, str]) -> Callable[[Path], None]:
    """The files given (debugfs, a firmware loader, a platform driver) added to the tree."""

    def make(root: Path) -> None:
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)

    return make


def _reserved(tree: Path) -> None:
    """decoder2.0 holding 256 MiB of pmem outside any region: something to free."""
    (_device(tree, "decoder2.0") / "dpa_size").write_text("268435456\n")
    (_device(tree, "decoder2.0") / "mode").write_text("pmem\n")


DEBUG = "sys/kernel/debug/cxl"
POISON = _files({f"{DEBUG}/mem0/inject_poison": "", f"{DEBUG}/mem0/clear_poison": ""})
EINJ = _files({f"{DEBUG}/einj_types": "0x00020000\tCXL.mem Protocol Fatal\n",
                       f"{DEBUG}/0000:0c:00.0/einj_inject": ""})  # fmt: skip
LOADER = _files({f"sys/class/firmware/mem0/{f}": t for f, t in
                         (("loading", "0\n"), ("data", ""), ("status", "idle\n"),
                          ("remaining_size", "0\n"), ("error", "\n"), ("cancel", ""))})  # fmt: skip
ACPI = _files({"sys/bus/platform/drivers/cxl_acpi/.keep": ""})
ACPI_UNBOUND = _files({"sys/bus/platform/drivers/cxl_acpi/.keep": "",
                               "sys/bus/platform/devices/ACPI0017:00/.keep": ""})  # fmt: skip
NOTHING: Callable[[Path], None] = lambda tree: None  # noqa: E731

# the name the docs give each -> (tree, what gives it something to do, the command line)
RUNS: dict[str, tuple[str, Callable[[Path], None], list[str]]] = {
    "region create": ("two-dev/fresh", NOTHING, ["region", "create"]),
    "region destroy": ("two-dev/region", NOTHING, ["region", "destroy", "region0", "-f"]),
    "region disable": ("two-dev/region", NOTHING, ["region", "disable", "region0", "-f"]),
    "region enable": ("two-dev/region", _unbind("region0"), ["region", "enable", "region0"]),
    "memdev read-labels": ("pmem-dev/fresh", NOTHING, ["memdev", "read-labels", "mem0"]),
    "memdev write-labels": ("pmem-dev/fresh", NOTHING,
                            ["memdev", "write-labels", "mem0", "-i", "{image}"]),
    "memdev zero-labels": ("pmem-dev/fresh", NOTHING, ["memdev", "zero-labels", "mem0"]),
    "memdev disable": ("pmem-dev/fresh", NOTHING, ["memdev", "disable", "mem0"]),
    "memdev enable": ("pmem-dev/fresh", _unbind("mem0"), ["memdev", "enable", "mem0"]),
    "memdev reserve-dpa": ("pmem-dev/fresh", NOTHING,
                           ["memdev", "reserve-dpa", "mem0", "-t", "pmem", "-s", "256M"]),
    "memdev free-dpa": ("pmem-dev/fresh", _reserved, ["memdev", "free-dpa", "mem0"]),
    "memdev set-partition": ("pmem-dev/fresh", NOTHING, ["memdev", "set-partition", "mem0"]),
    "memdev update-firmware": ("pmem-dev/fresh", LOADER,
                               ["memdev", "update-firmware", "mem0", "-F", "{image}"]),
    "memdev set-alert-config": ("pmem-dev/fresh", NOTHING,
                                ["memdev", "set-alert-config", "mem0", "--life-used-alert",
                                 "off"]),
    "memdev sanitize": ("pmem-dev/fresh", NOTHING, ["memdev", "sanitize", "mem0", "-f"]),
    "memdev wait-sanitize": ("pmem-dev/fresh", NOTHING, ["memdev", "wait-sanitize", "mem0"]),
    "memdev inject-media-poison": ("pmem-dev/fresh", POISON,
                                   ["memdev", "inject-media-poison", "mem0", "-a", "0x1000"]),
    "memdev clear-media-poison": ("pmem-dev/fresh", POISON,
                                  ["memdev", "clear-media-poison", "mem0", "-a", "0x1000"]),
    "port disable": ("pmem-dev/fresh", NOTHING, ["port", "disable", "port1", "-f"]),
    "port enable": ("pmem-dev/fresh", _unbind("port1"), ["port", "enable", "port1"]),
    "port inject-protocol-error": ("pmem-dev/fresh", EINJ, ["port", "inject-protocol-error",
                                                            "0000:0c:00.0", "-t", "mem-fatal"]),
    "bus disable": ("pmem-dev/fresh", ACPI, ["bus", "disable", "root0", "-f"]),
    "bus enable": ("pmem-dev/fresh", ACPI_UNBOUND, ["bus", "enable"]),
    "numa --set-weights": ("two-dev/fresh", NOTHING, ["numa", "--set-weights", "0=3"]),
    "numa": ("two-dev/fresh", NOTHING, ["numa"]),
    "list": ("two-dev/region", NOTHING, ["list", "-vvv"]),
    "check": ("two-dev/region", NOTHING, ["check"]),
    "stat": ("two-dev/region", NOTHING, ["stat"]),
    "labels": ("two-dev/region", NOTHING, ["labels", "-F", "nfd"]),
}  # fmt: skip


def documented() -> set[str]:
    """The commands docs/cli.md says write a recorded tree."""
    text = " ".join(DOCS.read_text().split())
    found = re.search(r"which write the tree's files \(never this machine's\): (.*?) \(a test "
                      r"holds this list", text)  # fmt: skip
    assert found, "docs/cli.md no longer lists the commands that write a tree"
    return set(re.findall(r"`([^`]+)`", found.group(1)))


def _state(tree: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry of a tree: kind, size, modification time (a write moves it)."""
    out = {}
    for dirpath, dirs, files in os.walk(tree):
        for name in dirs + files:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), tree)] = (
                st.st_mode, st.st_size, st.st_mtime_ns)  # fmt: skip
    return out


def test_every_command_that_takes_a_sysroot_is_run() -> None:
    def options(path: tuple[str, ...]) -> list[str]:
        return [o for prm in command(path).params for o in getattr(prm, "opts", [])]

    takes = {" ".join(p) for p in commands() if "--sysroot" in options(p)}
    assert takes | {"numa --set-weights"} == set(RUNS)


def test_what_writes_a_recorded_tree_is_what_the_docs_say(tmp_path: Path) -> None:
    image = tmp_path / "image.bin"
    image.write_bytes(bytes(4096))
    wrote, said = set(), {}
    for name, (tree_name, prepare, argv) in RUNS.items():
        tree = tmp_path / name.replace(" ", "_")
        shutil.copytree(TREES / tree_name, tree, symlinks=True)
        prepare(tree)
        before = _state(tree)
        args = [a.format(image=image) for a in argv]
        code, _, err = run_in_child([*args, "--sysroot", str(tree)])
        assert code != 70 and "Traceback" not in err, (name, err)
        said[name] = f"exit {code}: {err.strip()[:200]}"
        if _state(tree) != before:
            wrote.add(name)
        else:
            assert name not in documented() or code != 0, (name, "had nothing to do", said[name])
    assert wrote == documented(), {n: said[n] for n in wrote ^ documented()}


@pytest.mark.parametrize("name", ["memdev write-labels", "memdev zero-labels",
                                  "memdev set-partition", "memdev set-alert-config",
                                  "memdev update-firmware", "memdev read-labels"])  # fmt: skip
def test_what_asks_a_device_refuses_a_tree_before_any_write(tmp_path: Path, name: str) -> None:
    tree_name, prepare, argv = RUNS[name]
    tree = tmp_path / "tree"
    shutil.copytree(TREES / tree_name, tree, symlinks=True)
    prepare(tree)
    before = _state(tree)
    image = tmp_path / "image.bin"
    image.write_bytes(bytes(4096))
    code, out, err = run_in_child([*(a.format(image=image) for a in argv), "--sysroot",
                                   str(tree)])  # fmt: skip
    assert code == 2 and out == "" and "a recorded tree" in err and "no device to ask" in err, err
    assert _state(tree) == before
