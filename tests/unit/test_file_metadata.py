"""Files pycxl rewrites keep their mode, owner, group and ACL, as ``sed -i`` does; where
they could not be kept the path is refused before any work. Every file-writing option
of every command is tried over existing files of several modes and owners."""

from __future__ import annotations

import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pycxl.base.errors import InvalidRequestError
from pycxl.base.outfiles import append_line, check_output_path, write_atomically

ROOT = Path(__file__).resolve().parents[2]
TREE = str(ROOT / "tests" / "data" / "trees" / "two-dev" / "region")
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="giving files to other users needs root")
# made-up ids no account on the machine has
UID, GID = 43210, 43211
# (mode, uid, gid): root's private file, a node_exporter group's, another user's set-gid one
KINDS = [(0o600, 0, 0), (0o640, 0, GID), (0o2664, UID, GID), (0o444, UID, 0)]


def _made(path: Path, mode: int, uid: int, gid: int) -> None:
    path.write_text("old\n")
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def _meta(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def _pycxl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycxl.cli.main", *args], capture_output=True,
                          text=True, check=False, timeout=120)  # fmt: skip


@AS_ROOT
@pytest.mark.parametrize(("mode", "uid", "gid"), KINDS)
def test_a_rewritten_file_keeps_its_mode_owner_and_group(
    tmp_path: Path, mode: int, uid: int, gid: int
) -> None:
    f = tmp_path / "x.prom"
    _made(f, mode, uid, gid)
    write_atomically(str(f), "new\n")
    assert f.read_text() == "new\n" and _meta(f) == (mode, uid, gid)
    assert [p.name for p in tmp_path.iterdir()] == ["x.prom"]  # no temporary left


def test_a_new_file_is_0644_less_the_umask_as_open_makes_it(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_atomically(str(tmp_path / "private.prom"), "x\n")
        append_line(str(tmp_path / "private.log"), "x")
    finally:
        os.umask(old)
    write_atomically(str(tmp_path / "usual.prom"), "x\n")
    assert stat.S_IMODE((tmp_path / "private.prom").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "private.log").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "usual.prom").stat().st_mode) == 0o644 & ~old


def _acl(uid: int) -> bytes:
    """A POSIX access ACL as the kernel stores it: owner rw, user ``uid`` r, group r,
    mask r, others none."""
    entries = [(0x01, 6, 0xFFFFFFFF), (0x02, 4, uid), (0x04, 4, 0xFFFFFFFF),
               (0x10, 4, 0xFFFFFFFF), (0x20, 0, 0xFFFFFFFF)]  # fmt: skip
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def test_a_rewritten_file_keeps_its_acl(tmp_path: Path) -> None:
    f = tmp_path / "x.prom"
    f.write_text("old\n")
    try:
        os.setxattr(f, "system.posix_acl_access", _acl(UID))
    except OSError as e:
        pytest.skip(f"this file system keeps no ACLs ({e.strerror})")
    write_atomically(str(f), "new\n")
    assert os.getxattr(f, "system.posix_acl_access") == _acl(UID)
    assert stat.S_IMODE(f.stat().st_mode) == 0o640  # the ACL's mask is the group's bits


@AS_ROOT
def test_what_cannot_be_kept_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, theirs = tmp_path / "mine.prom", tmp_path / "theirs.prom"
    for f, (uid, gid) in ((mine, (UID + 1, GID)), (theirs, (UID, GID + 1))):
        _made(f, 0o644, uid, gid)
    # this user is UID + 1, not root, in no group but its own
    monkeypatch.setattr(os, "geteuid", lambda: UID + 1)
    monkeypatch.setattr(os, "getegid", lambda: GID + 1)
    monkeypatch.setattr(os, "getgroups", lambda: [])
    with pytest.raises(InvalidRequestError, match=f"has group gid {GID}, which this user is "
                       "not in.*run as a member of it or as root"):  # fmt: skip
        check_output_path(str(mine), "textfile")
    with pytest.raises(InvalidRequestError, match=f"belongs to uid {UID}: .*run as uid {UID} "
                       "or as root, or remove"):  # fmt: skip
        check_output_path(str(theirs), "textfile")
    check_output_path(str(tmp_path / "new.prom"), "textfile")  # a new file is this user's
    check_output_path(str(theirs), "--log", appends=True)  # appended to in place: kept


@AS_ROOT
def test_a_cli_refusal_names_the_owner_and_changes_nothing(tmp_path: Path) -> None:
    f = tmp_path / "x.prom"
    _made(f, 0o640, UID, GID)
    # the command as a user who is not root (the ids it asks for say so)
    code = (
        f"import os, sys; os.geteuid = lambda: {UID + 1}; os.getegid = lambda: {GID + 1}; "
        "os.getgroups = lambda: []; sys.argv[0] = 'pycxl'; "
        "from pycxl.cli.main import main; sys.exit(main())"
    )
    p = subprocess.run([sys.executable, "-c", code, "stat", "--textfile", str(f), "--sysroot",
                        TREE], capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert f"belongs to uid {UID}" in p.stderr and "Traceback" not in p.stderr
    assert f.read_text() == "old\n" and _meta(f) == (0o640, UID, GID)


def _writers(tmp_path: Path) -> list[tuple[str, list[str]]]:
    """Every option that rewrites a named file, with a command line that writes it."""
    d = str(tmp_path)
    return [
        ("labels.txt", ["labels", "-F", "slurm", "-o", f"{d}/labels.txt", "--sysroot", TREE]),
        ("nfd.txt", ["labels", "-F", "nfd", "--output", f"{d}/nfd.txt", "--sysroot", TREE]),
        ("check.prom", ["check", "--no-health", "--events", "", "--textfile",
                        f"{d}/check.prom", "--sysroot", TREE]),
        ("stat.prom", ["stat", "--textfile", f"{d}/stat.prom", "--sysroot", TREE]),
        ("top.prom", ["top", "--once", "--textfile", f"{d}/top.prom"]),
    ]  # fmt: skip


@AS_ROOT
@pytest.mark.parametrize("kind", range(len(KINDS)))
def test_every_file_writing_option_keeps_the_file_metadata(tmp_path: Path, kind: int) -> None:
    mode, uid, gid = KINDS[kind]
    for name, args in _writers(tmp_path):
        f = tmp_path / name
        _made(f, mode, uid, gid)
        p = _pycxl(*args)
        if name == "top.prom" and p.returncode == 4:
            continue  # no counters on this machine: top writes nothing
        assert p.returncode == 0, (args, p.stderr)
        assert f.read_text() != "old\n" and _meta(f) == (mode, uid, gid), (name, _meta(f))


@AS_ROOT
def test_plots_and_label_areas_are_written_through_the_same_place(tmp_path: Path) -> None:
    from cli.bench.plots import save

    class Figure:
        def savefig(self, out: object, format: str) -> None:
            out.write(b"PNG:" + format.encode())  # type: ignore[attr-defined]

    f = tmp_path / "p.png"
    _made(f, 0o640, UID, GID)
    save(Figure(), str(f))
    assert f.read_bytes() == b"PNG:png" and _meta(f) == (0o640, UID, GID)
    log = tmp_path / "events.jsonl"
    _made(log, 0o640, UID, GID)
    append_line(str(log), "{}")
    assert log.read_text() == "old\n{}\n" and _meta(log) == (0o640, UID, GID)


def test_every_writer_goes_through_outfiles() -> None:
    """No module but outfiles replaces or creates a file a user named."""
    import re

    calls = re.compile(r"\bos\.replace\(|\bos\.rename\(|\bmkstemp\(|\.savefig\(")
    found = []
    for base in (ROOT / "pycxl", ROOT / "cli"):
        for path in base.rglob("*.py"):
            if path.name == "outfiles.py" or "testbed" in path.parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if calls.search(line) and "savefig(data" not in line:
                    found.append(f"{path.relative_to(ROOT)}:{n}")
    assert found == []
