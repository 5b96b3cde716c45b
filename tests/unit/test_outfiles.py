"""Files pycxl writes for other readers: checked first, replaced atomically, never
written through a symbolic link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pycxl.base.errors import InvalidRequestError, OperationError
from pycxl.base.outfiles import append_line, check_output_path, write_atomically


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("", "empty"),
        ("missing/x.prom", "does not exist"),
        ("x.txt", "must end in .prom"),
        ("adir.prom", "is a directory"),
        ("link.prom", "symbolic link"),
    ],
)
def test_bad_output_paths_are_refused_naming_the_problem(
    tmp_path: Path, name: str, words: str
) -> None:
    (tmp_path / "adir.prom").mkdir()
    (tmp_path / "link.prom").symlink_to(tmp_path / "elsewhere.prom")
    path = str(tmp_path / name) if name else ""
    with pytest.raises(InvalidRequestError, match=words):
        check_output_path(path, "textfile", suffixes=(".prom",))
    assert not (tmp_path / "elsewhere.prom").exists()


def test_an_unwritable_folder_is_refused(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes to any folder")
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    with pytest.raises(InvalidRequestError, match="not writable"):
        check_output_path(str(folder / "x.png"), "--plot")


def test_an_atomic_write_replaces_a_planted_link_instead_of_following_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    path = tmp_path / "out.prom"
    path.symlink_to(victim)
    write_atomically(str(path), "new\n")
    assert victim.read_text() == "keep\n"
    assert not path.is_symlink() and path.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.prom", "victim"]


def test_appending_through_a_planted_link_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    log = tmp_path / "events.jsonl"
    append_line(str(log), '{"a": 1}')
    append_line(str(log), '{"a": 2}\n')
    assert log.read_text() == '{"a": 1}\n{"a": 2}\n'
    log.unlink()
    log.symlink_to(victim)
    with pytest.raises(OperationError, match="symbolic link"):
        append_line(str(log), '{"a": 3}')
    assert victim.read_text() == "keep\n"
