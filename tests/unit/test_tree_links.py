"""A recorded tree never reaches outside itself: not for reading, listing, writing,
opening a device or sending it an ioctl. A sysroot that is not a sysfs tree is refused,
and a tree has no device to ask: whatever its dev/cxl/mem0 is (a link out of it, a
FIFO, a character node, a folder), every device command leaves it and its target alone."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from pycxl.base.errors import InvalidRequestError, OperationError, SysfsError
from pycxl.base.sysfs import Sysfs
from pycxl.cxl.mailbox import Mailbox
from tests.unit.test_fuzz import command, run_in_child

ROOT = Path(__file__).resolve().parents[2]
TREES = ROOT / "tests" / "data" / "trees"
PMEM = TREES / "pmem-dev" / "fresh"


def _victim(path: Path, text: str = "this machine's\n") -> tuple[str, int]:
    """A file outside the tree whose reading would show: its access time is set before
    its change time, so any read moves it (relatime)."""
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_mtime_ns - 10**10, st.st_mtime_ns))
    return text, path.stat().st_atime_ns


def _untouched(path: Path, seen: tuple[str, int]) -> bool:
    """Whether the file has not been read or changed; reading it here to see puts its
    access time back."""
    st = path.stat()
    text = path.read_text()
    os.utime(path, ns=(seen[1], st.st_mtime_ns))
    return (text, st.st_atime_ns) == seen


# --- what a sysroot must be ------------------------------------------------------------
@pytest.mark.parametrize("kind", ["empty", "proc", "only sys", "sys of proc"])
def test_a_folder_that_is_not_a_sysfs_tree_is_refused(tmp_path: Path, kind: str) -> None:
    root = {"empty": tmp_path, "proc": Path("/proc"), "only sys": tmp_path,
            "sys of proc": tmp_path}[kind]  # fmt: skip
    if kind == "only sys":
        (tmp_path / "sys" / "kernel").mkdir(parents=True)
    if kind == "sys of proc":  # /proc/sys is no /sys
        (tmp_path / "sys").symlink_to("/proc/sys")
    with pytest.raises(InvalidRequestError, match="is not a sysfs tree: it has no sys/devices"):
        Sysfs(root)
    for argv in (["list", "--sysroot", str(root)], ["stat", "--sysroot", str(root)],
                 ["labels", "-F", "slurm", "--sysroot", str(root)]):  # fmt: skip
        code, out, err = run_in_child(argv)
        assert code == 2 and out == "", (argv, code, out, err)
        assert f"--sysroot {root} is not a sysfs tree" in err and "Traceback" not in err


def test_the_environment_sysroot_is_checked_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYCXL_SYSROOT", str(tmp_path))
    with pytest.raises(InvalidRequestError, match=f"PYCXL_SYSROOT {tmp_path} is not a sysfs"):
        Sysfs()


def test_every_recorded_tree_is_a_sysfs_tree() -> None:
    trees = sorted(p for p in TREES.glob("*/*") if p.is_dir())
    assert len(trees) >= 6
    for tree in trees:
        assert Sysfs(tree).root == str(tree)
    assert Sysfs("/").root == "/"


# --- links out of a tree ---------------------------------------------------------------
def test_an_attribute_or_folder_that_leads_out_is_never_read_listed_or_written(
    tmp_path: Path,
) -> None:
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    (tree / "sys" / "devices").mkdir(parents=True)
    (outside / "folder").mkdir(parents=True)
    seen = _victim(outside / "attr")
    (outside / "folder" / "inner").write_text("x\n")
    (tree / "sys" / "devices" / "attr").symlink_to(outside / "attr")
    (tree / "sys" / "devices" / "rel").symlink_to("../../../outside/attr")
    (tree / "sys" / "bus").symlink_to(outside / "folder")
    fs = Sysfs(tree)
    for rel in ("/sys/devices/attr", "/sys/devices/rel", "/sys/bus/inner"):
        with pytest.raises(SysfsError, match="leads out of the recorded tree"):
            fs.read(rel)
        with pytest.raises(SysfsError, match="leads out of the recorded tree"):
            fs.read_bytes(rel)
        with pytest.raises(SysfsError, match="leads out of the recorded tree"):
            fs.write(rel, "1")
    with pytest.raises(SysfsError, match="leads out of the recorded tree"):
        fs.listdir("/sys/bus")
    assert _untouched(outside / "attr", seen)
    assert (outside / "folder" / "inner").read_text() == "x\n"


# --- a tree's device nodes ---------------------------------------------------------------
def _node_kinds(outside: Path) -> dict[str, Callable[[Path], None]]:
    """What a tree's dev/cxl/mem0 may be, each made by the test in its own folder."""
    return {
        "link out": lambda p: p.symlink_to(outside / "victim"),
        "link to a device": lambda p: p.symlink_to("/dev/null"),
        "fifo": lambda p: os.mkfifo(p),
        "char node": lambda p: os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 3)),
        "folder": lambda p: p.mkdir(),
        "file": lambda p: p.write_text("labels\n"),
    }


# every device command that takes --sysroot; the mailbox's are refused for a tree
MAILBOX = "has no device to ask"
DEVICE_COMMANDS: list[tuple[list[str], str | None]] = [
    (["memdev", "read-labels", "mem0", "-s", "4K"], MAILBOX),
    (["memdev", "read-labels", "mem0", "-o", "{out}"], MAILBOX),
    (["memdev", "write-labels", "mem0", "-i", "{image}"], MAILBOX),
    (["memdev", "write-labels", "mem0", "-i", "{image}", "--dry-run"], None),
    (["memdev", "zero-labels", "mem0"], MAILBOX),
    (["memdev", "zero-labels", "mem0", "--dry-run"], None),
    (["memdev", "set-partition", "mem0"], MAILBOX),
    (["memdev", "set-partition", "mem0", "--dry-run"], MAILBOX),
    (["memdev", "set-alert-config", "mem0", "--life-used-alert", "off"], MAILBOX),
    (["memdev", "set-alert-config", "mem0", "--life-used-alert", "off", "--dry-run"], None),
    (["memdev", "update-firmware", "mem0", "-F", "{image}"], None),  # no loader in the tree
    (["memdev", "disable", "mem0", "--dry-run"], None),
    (["memdev", "enable", "mem0", "--dry-run"], None),
    (["memdev", "reserve-dpa", "mem0", "-s", "256M", "--dry-run"], None),
    (["memdev", "free-dpa", "mem0", "--dry-run"], None),
    (["memdev", "sanitize", "mem0", "-f", "--dry-run"], None),
    (["memdev", "wait-sanitize", "mem0"], None),
    (["memdev", "inject-media-poison", "mem0", "-a", "0x1000", "--dry-run"], None),
    (["memdev", "clear-media-poison", "mem0", "-a", "0x1000", "--dry-run"], None),
    (["port", "disable", "port1", "--dry-run"], None),
    (["port", "enable", "port1", "--dry-run"], None),
    (["port", "inject-protocol-error", "0000:0c:00.0", "-t", "mem-fatal", "--dry-run"], None),
    (["bus", "disable", "root0", "--dry-run"], None),
    (["bus", "enable", "--dry-run"], None),
]  # fmt: skip


def test_the_device_commands_listed_are_all_there_are() -> None:
    import click

    listed = {tuple(argv[:2]) for argv, _ in DEVICE_COMMANDS}
    for group in ("memdev", "port", "bus"):
        g = command((group,))
        assert isinstance(g, click.Group)
        assert {(group, name) for name in g.commands} <= listed, group


def test_device_commands_never_reach_out_of_a_tree_through_its_dev(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    image = outside / "image.bin"
    image.write_bytes(bytes(4096))
    seen = _victim(outside / "victim", "not a device\n")
    for kind, make in _node_kinds(outside).items():
        tree = tmp_path / kind.replace(" ", "-")
        shutil.copytree(PMEM, tree, symlinks=True)
        node = tree / "dev" / "cxl" / "mem0"
        node.parent.mkdir(parents=True)
        make(node)
        before = os.lstat(node)
        for argv, says in DEVICE_COMMANDS:
            args = [a.format(image=image, out=tmp_path / "labels.bin") for a in argv]
            code, _, err = run_in_child([*args, "--sysroot", str(tree)])
            said = f"{kind}: {' '.join(argv)}: exit {code}: {err}"
            assert code != 70 and "Traceback" not in err and "internal error" not in err, said
            if says:
                assert code == 2 and says in err, said
            assert _untouched(outside / "victim", seen), said
            after = os.lstat(node)
            assert (after.st_mode, after.st_rdev, after.st_ino) == (
                before.st_mode, before.st_rdev, before.st_ino), said  # fmt: skip
        assert not (tmp_path / "labels.bin").exists()


# --- this machine's /dev/cxl/memN --------------------------------------------------------
@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_a_mailbox_is_opened_only_when_it_is_the_memdevs_character_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    sent: list[int] = []
    monkeypatch.setattr(fcntl, "ioctl", lambda fd, req, *a: sent.append(req))
    outside = tmp_path / "outside"
    outside.mkdir()
    seen = _victim(outside / "victim")
    words = {"link out": "a symbolic link", "link to a device": "a symbolic link",
             "fifo": "a FIFO", "char node": "is device 1:3, but mem0 is 250:0",
             "folder": "a directory", "file": "a regular file"}  # fmt: skip
    for kind, make in _node_kinds(outside).items():
        dev = tmp_path / kind.replace(" ", "-")
        dev.mkdir()
        make(dev / "mem0")
        with pytest.raises(OperationError, match=f"{words[kind]}.*mknod {dev}/mem0 c 250 0"):
            Mailbox("mem0", str(dev), (250, 0))
    with pytest.raises(OperationError, match="does not exist"):
        Mailbox("mem0", str(tmp_path / "none"), (250, 0))
    # the memdev's own numbers (made here as /dev/null's): opened, and nothing sent yet
    with Mailbox("mem0", str(tmp_path / "char-node"), (1, 3)) as mbox:
        assert mbox.memdev == "mem0"
    assert sent == [] and _untouched(outside / "victim", seen)
