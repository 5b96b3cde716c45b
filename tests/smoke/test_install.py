"""The README's first command on a clean environment: ``pip install . && pycxl list``.

A fresh virtual environment (it sees this interpreter's packages, as a user's does their
system's) gets pycxl from the source tree the README's way: a built wheel, not the
editable install the tests use, so a file left out of the package fails here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.smoke.examples import ROOT


def test_readme_install_then_list(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True)  # fmt: skip
    src = tmp_path / "src"  # a copy of the tracked files: the build writes nothing here
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True,
                           capture_output=True, text=True).stdout.split("\0")  # fmt: skip
    for name in files:
        if name and not name.startswith("tests/data/") and (ROOT / name).exists():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name, follow_symlinks=False)
    p = subprocess.run(
        ["sh", "-c", "pip install -q . && pycxl list"],
        cwd=src, env={"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "dram0" in p.stdout and "Traceback" not in p.stderr
    installed = subprocess.run(
        [f"{venv}/bin/python", "-c", "import pycxl, pycxl._bench; print(pycxl.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert str(venv) in installed  # the wheel's copy, not the source tree
