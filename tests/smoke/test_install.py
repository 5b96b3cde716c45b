"""The README's first command on a clean environment: ``pip install . && pycxl list``.

A fresh virtual environment (it sees this interpreter's packages, as a user's does their
system's) gets pycxl from the source tree the README's way: a built wheel, not the
editable install the tests use, so a file or package left out of the wheel fails here.
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
    # every module of the source tree is in the wheel (a package missing from
    # pyproject's list installs fine and fails only when a command imports it)
    walk = ("import pkgutil, pycxl; print('\\n'.join(['pycxl'] + [m.name for m in "
            "pkgutil.walk_packages(pycxl.__path__, 'pycxl.')]))")  # fmt: skip
    listed = subprocess.run([f"{venv}/bin/python", "-c", walk], cwd=tmp_path,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    missing = _source_modules() - set(listed.split())
    assert not missing, f"not in the wheel: {missing}"
    for command in ("check -q", "stat --json"):
        p = subprocess.run(["sh", "-c", f"pycxl {command}"], cwd=tmp_path,
                           env={"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": str(tmp_path)},
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert p.returncode in (0, 4, 6, 7), f"pycxl {command}: {p.stderr[-2000:]}"


def _source_modules() -> set[str]:
    """Module names of the source tree, as installed (cli/ and native/ go inside pycxl)."""
    names = set()
    for top, package in (("pycxl", "pycxl"), ("cli", "pycxl.cli"), ("native", "pycxl.native")):
        for f in (ROOT / top).rglob("*.py"):
            rel = f.relative_to(ROOT / top).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if top == "native" and parts and parts[0].startswith("build_"):
                continue  # build-time scripts, not modules of the package
            names.add(".".join([package, *parts]))
    return names
