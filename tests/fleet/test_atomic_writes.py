"""Every file pycxl writes for another program (node_exporter's textfiles, the
node-feature-discovery feature file, the Slurm attributes) is replaced atomically: a
writer killed half-way leaves the reader the old file, whole. Each writer is stopped
for good in the middle of its write and before its rename (the SIGKILL an OOM kill or a
reboot gives), then the real reader reads: node_exporter, and node-feature-discovery's
rules. A writer that wrote in place, stopped the same way, would hand them half a file:
the same test shows it does, so it would catch one."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import node_exporter
from tests.fleet import alerting, nfd_format
from tests.fleet.trees import FRESH, REGION

ROOT = Path(__file__).resolve().parents[2]
# writer -> (the command with FILE for its output, the file's name, the reader)
WRITERS = {
    "check": (["check", "--textfile", "FILE"], "pycxl-check.prom", "node_exporter"),
    "stat": (["stat", "--textfile", "FILE"], "pycxl-stat.prom", "node_exporter"),
    "nfd": (["labels", "--format", "nfd", "--output", "FILE"], "pycxl", "nfd"),
    "slurm": (["labels", "--format", "slurm", "--output", "FILE"], "pycxl.slurm", "text"),
}


def _command(writer: str, out: Path, tree: Path) -> list[str]:
    args, _, _ = WRITERS[writer]
    return [str(out) if a == "FILE" else a for a in args] + ["--sysroot", str(tree)]


def _read(reader: str, folder: Path, out: Path) -> object:
    """What the reader takes from the folder now."""
    if reader == "node_exporter":
        exporter = node_exporter.binary()
        if exporter is None:
            pytest.skip("prometheus-node-exporter is not installed")
        lines = node_exporter.scrape(str(folder), exporter)
        return ("node_textfile_scrape_error 0" in lines, alerting.samples(lines))
    if reader == "nfd":  # every file nfd-worker would read in features.d
        now = datetime.datetime.now(datetime.UTC)
        return [nfd_format.read(p, now) for p in sorted(folder.iterdir())
                if not p.name.startswith(".")]  # fmt: skip
    return out.read_text()


def _interrupted(point: str, command: list[str]) -> subprocess.Popen[bytes]:
    """The writer, stopped at ``point`` (it has said so when this returns)."""
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "tests.fleet.interrupted_writer", point,
                             str(w), "--", *command], cwd=ROOT, pass_fds=(w,),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    os.close(w)
    with os.fdopen(r, "rb") as ready:
        said = ready.read(1)  # a byte when it stops there; EOF if it ended instead
    if said != b"x":
        out, err = proc.communicate(timeout=60)
        raise AssertionError(f"the writer did not stop at {point}: {out!r} {err!r}")
    return proc


@pytest.mark.parametrize("point", ["mid-write", "before-rename"])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_writer_killed_half_way_leaves_the_old_file_whole(
    tmp_path: Path, writer: str, point: str
) -> None:
    _, name, reader = WRITERS[writer]
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / name
    # the old file: the host without a region; the new one would have region0
    p = subprocess.run([sys.executable, "-m", "pycxl.cli.main", *_command(writer, out, FRESH)],
                       capture_output=True, check=False)  # fmt: skip
    assert p.returncode in (0, 6), p.stderr
    old_bytes, old_read = out.read_bytes(), _read(reader, folder, out)
    proc = _interrupted(point, _command(writer, out, REGION))
    try:
        (tmp,) = [p for p in folder.iterdir() if p.name.startswith(".pycxl-")]
        assert tmp.stat().st_size > 0
        assert out.read_bytes() == old_bytes
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert out.read_bytes() == old_bytes
    assert _read(reader, folder, out) == old_read
    if reader == "node_exporter":
        assert old_read[0]  # type: ignore[index]
    # its temporary file stays behind, hidden, where no reader looks
    (left,) = [p.name for p in folder.iterdir() if p.name != name]
    assert left.startswith(".pycxl-") and left.endswith(".tmp")
    # the next run replaces the file as usual
    p = subprocess.run([sys.executable, "-m", "pycxl.cli.main", *_command(writer, out, REGION)],
                       capture_output=True, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert out.read_bytes() != old_bytes and _read(reader, folder, out) != old_read


@pytest.mark.parametrize("writer", ["check", "nfd"])
def test_a_writer_in_place_would_hand_readers_half_a_file(tmp_path: Path, writer: str) -> None:
    _, name, reader = WRITERS[writer]
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / name
    subprocess.run([sys.executable, "-m", "pycxl.cli.main", *_command(writer, out, FRESH)],
                   capture_output=True, check=False)  # fmt: skip
    old_read = _read(reader, folder, out)
    proc = _interrupted("naive", _command(writer, out, REGION))
    try:
        seen = _read(reader, folder, out)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert seen != old_read
    if reader == "node_exporter":  # half a textfile: refused, or fewer series
        ok, series = seen  # type: ignore[misc]
        assert not ok or len(series) < len(old_read[1])  # type: ignore[index]
    else:  # half a feature file: some labels, or a label cut short
        ((labels, _),) = seen  # type: ignore[misc]
        assert len(labels) < 7
