"""Hand-broken copies of recorded trees: clear errors naming the file, no traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pycxl.base.errors import SysfsError
from pycxl.base.sysfs import Sysfs
from pycxl.cxl.sysfs_backend import read_topology


@pytest.fixture
def broken(tmp_path: Path, trees: Path) -> Path:
    dest = tmp_path / "tree"
    shutil.copytree(trees / "two-dev/region", dest, symlinks=True)
    return dest


def _mem0(root: Path) -> Path:
    return (root / "sys/bus/cxl/devices/mem0").resolve()


def test_malformed_attribute_names_the_file(broken: Path) -> None:
    (_mem0(broken) / "serial").write_text("not-a-number\n")
    with pytest.raises(SysfsError, match=r"mem0/serial: expected an integer, found 'not-a-number'"):
        read_topology(Sysfs(broken))
    p = subprocess.run(
        [sys.executable, "-m", "pycxl.cli.main", "list", "--sysroot", str(broken)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert p.returncode == 1
    assert "serial: expected an integer" in p.stderr and "Traceback" not in p.stderr


def test_unreadable_attribute_names_the_file(broken: Path) -> None:
    size = _mem0(broken) / "ram" / "size"
    size.unlink()
    size.mkdir()  # a directory where a file should be: reading it fails for root too
    with pytest.raises(SysfsError, match=r"ram/size: is a directory"):
        read_topology(Sysfs(broken))


def test_malformed_cpulist(broken: Path) -> None:
    (broken / "sys/devices/system/node/node0/cpulist").write_text("0-x\n")
    from pycxl.numa.nodes import read_nodes

    with pytest.raises(SysfsError, match=r"node0/cpulist: expected a CPU list"):
        read_nodes(Sysfs(broken))
