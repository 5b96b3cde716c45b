"""The README's two set-up commands.

The install command runs as written on a copy of the tracked files, with the ``python3``
this host's tests were set up with and with Debian's own (externally managed, PEP 668:
it refuses ``pip install``), each into a temporary place (``PYCXL_PREFIX``,
``PYCXL_BIN_DIR``) instead of /opt/pycxl and /usr/local/bin; then ``pycxl list`` runs
through the link, as a shell and as sudo find it. The environment gets a built wheel, not
the editable install the tests use, so a file or package left out of the wheel fails here.

The test command runs pytest from the repository's .venv, unactivated: what the tests
start by name (the console script, virtme-ng's) must come from there too.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.smoke.examples import ROOT

DEBIAN_PYTHON = "/usr/bin/python3"
BASE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# sudo's secure_path on Debian and Ubuntu; the test's link folder stands for /usr/local/bin
SECURE_PATH = "/usr/local/sbin:{bindir}:/usr/sbin:/usr/bin:/sbin:/bin"


def readme_command(section: str) -> str:
    """The one command of a README section's one code block."""
    text = (ROOT / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```\n(.*?)^```$", body, re.M | re.S)
    assert len(blocks) == 1 and len(blocks[0].strip().splitlines()) == 1, blocks
    return str(blocks[0].strip())


INSTALL = readme_command("Install and run")
TEST = readme_command("Tests")


def _externally_managed(python: str) -> bool:
    code = ("import os, sysconfig; print(os.path.exists(os.path.join("
            "sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))")  # fmt: skip
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


def _interpreters() -> list[object]:
    """This host's python3 (the one the tests' environment was made from), and Debian's."""
    own = os.path.realpath(sys._base_executable)
    debian = os.path.realpath(DEBIAN_PYTHON) if os.path.exists(DEBIAN_PYTHON) else None
    params: list[object] = []
    if own != debian:
        params.append(pytest.param(own, id="this-python3"))
    if debian is None:
        why = f"no {DEBIAN_PYTHON} on this host"
        params.append(pytest.param(DEBIAN_PYTHON, id="debian-python3", marks=pytest.mark.skip(why)))
    elif not _externally_managed(DEBIAN_PYTHON):
        why = f"{DEBIAN_PYTHON} is not externally managed (PEP 668) here"
        params.append(pytest.param(DEBIAN_PYTHON, id="debian-python3", marks=pytest.mark.skip(why)))
    else:
        params.append(pytest.param(DEBIAN_PYTHON, id="debian-python3"))
    return params


def _copy_tracked(dest: Path) -> Path:
    """A copy of the tracked files (the build then writes nothing into the work tree)."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True,
                           capture_output=True, text=True).stdout.split("\0")  # fmt: skip
    for name in files:
        if name and not name.startswith("tests/data/") and (ROOT / name).exists():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name, follow_symlinks=False)
    return dest


def _passed_on() -> dict[str, str]:
    """What a user's shell would keep for pip: its settings, proxies and cache."""
    env = {
        k: v for k, v in os.environ.items() if k.startswith("PIP_") or k.lower().endswith("_proxy")
    }
    env.setdefault("PIP_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "pip"))
    return env


@pytest.mark.parametrize("python", _interpreters())
def test_readme_install_then_list(python: str, tmp_path: Path) -> None:
    assert INSTALL.endswith("&& pycxl list"), INSTALL
    src = _copy_tracked(tmp_path / "src")
    prefix, bindir = tmp_path / "opt" / "pycxl", tmp_path / "bin"
    pybin = tmp_path / "python-bin"  # `python3` on PATH is the interpreter under test
    pybin.mkdir()
    (pybin / "python3").symlink_to(python)
    env = {
        **_passed_on(),
        "PATH": f"{bindir}:{pybin}:{BASE_PATH}",
        "HOME": str(tmp_path / "home"),
        "PYCXL_PREFIX": str(prefix),
        "PYCXL_BIN_DIR": str(bindir),
    }
    p = subprocess.run(["sh", "-c", INSTALL], cwd=src, env=env, capture_output=True,
                       text=True, timeout=900, check=False)  # fmt: skip
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "dram0" in p.stdout and "Traceback" not in p.stderr

    # the link is the environment's own command, which needs no activation; the
    # environment runs on the interpreter under test
    link = bindir / "pycxl"
    assert link.is_symlink() and os.readlink(link) == str(prefix / "bin" / "pycxl")
    shebang = (prefix / "bin" / "pycxl").read_text().splitlines()[0]
    assert shebang == f"#!{prefix}/bin/python", shebang
    venv_python = str(prefix / "bin" / "python")
    base = subprocess.run([venv_python, "-c", "import os, sys; print(os.path.realpath("
                           "sys._base_executable))"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    assert base == os.path.realpath(python)

    # as root runs it through sudo: an emptied environment, secure_path, another folder
    sudo_path = SECURE_PATH.format(bindir=bindir)
    p = subprocess.run(["env", "-i", f"PATH={sudo_path}", "pycxl", "list"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert p.returncode == 0 and "dram0" in p.stdout, p.stderr[-2000:]
    if os.geteuid() == 0 and shutil.which("sudo"):
        p = subprocess.run(["sudo", "-n", str(link), "list"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert p.returncode == 0 and "dram0" in p.stdout, p.stderr[-2000:]

    installed = subprocess.run(
        [venv_python, "-c", "import pycxl, pycxl._bench; print(pycxl.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert str(prefix) in installed  # the wheel's copy, not the source tree
    # every module of the source tree is in the wheel (a package missing from
    # pyproject's list installs fine and fails only when a command imports it)
    walk = ("import pkgutil, pycxl; print('\\n'.join(['pycxl'] + [m.name for m in "
            "pkgutil.walk_packages(pycxl.__path__, 'pycxl.')]))")  # fmt: skip
    listed = subprocess.run([venv_python, "-c", walk], cwd=tmp_path,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    missing = _source_modules() - set(listed.split())
    assert not missing, f"not in the wheel: {missing}"
    for command in ("check -q", "stat --json"):
        p = subprocess.run(["sh", "-c", f"pycxl {command}"], cwd=tmp_path,
                           env={"PATH": f"{bindir}:{BASE_PATH}", "HOME": str(tmp_path)},
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert p.returncode in (0, 4, 6, 7), f"pycxl {command}: {p.stderr[-2000:]}"


def test_readme_install_replaces_only_its_own(tmp_path: Path) -> None:
    # a folder that is not a virtual environment, and a pycxl command that is a file (an
    # earlier `pip install` into the system), stay; the error names them and the way out,
    # before anything is built or installed
    bindir, prefix = tmp_path / "bin", tmp_path / "venv"
    env = {"PATH": BASE_PATH, "HOME": str(tmp_path), "PYTHON": sys._base_executable,
           "PYCXL_PREFIX": str(prefix), "PYCXL_BIN_DIR": str(bindir)}  # fmt: skip
    install = ["bash", str(ROOT / "scripts" / "install.sh")]
    prefix.mkdir()
    (prefix / "notes.txt").write_text("not an environment\n")
    p = subprocess.run(install, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 1 and f"{prefix} exists and is not a virtual environment" in p.stderr
    assert "PYCXL_PREFIX=DIR" in p.stderr and os.listdir(prefix) == ["notes.txt"]
    assert not bindir.exists()
    (prefix / "notes.txt").unlink()
    bindir.mkdir()
    (bindir / "pycxl").write_text("#!/bin/sh\n")
    p = subprocess.run(install, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 1 and f"{bindir}/pycxl exists and is not a link" in p.stderr
    assert "PYCXL_BIN_DIR=DIR" in p.stderr and (bindir / "pycxl").read_text() == "#!/bin/sh\n"
    assert os.listdir(prefix) == []


def test_the_test_command_runs_pytest_from_the_venv() -> None:
    setup, _, run = TEST.partition("&&")
    assert setup.split() == ["bash", "scripts/setup-test-env.sh"], TEST
    argv = [w for w in shlex.split(run) if not re.match(r"^[A-Z_]+=", w)]
    assert argv[:3] == [".venv/bin/python", "-m", "pytest"], TEST
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith(TEST)
    if Path(sys.prefix) != ROOT / ".venv":
        said = f"the README's test command runs .venv/bin/python; this is {sys.executable}"
        if os.environ.get("PYCXL_REQUIRE_TESTBED") == "1":
            pytest.fail(said, pytrace=False)
        pytest.skip(said)
    cfg = (ROOT / ".venv" / "pyvenv.cfg").read_text()
    assert re.search(r"^include-system-site-packages = false$", cfg, re.M), cfg
    import pycxl

    assert Path(pycxl.__file__).is_relative_to(ROOT / "pycxl")  # the source tree, editable
    from pycxl.testbed.kernel import vng_command

    assert vng_command() == str(ROOT / ".venv" / "bin" / "vng")


def test_the_testbed_starts_virtme_ng_from_an_environment_not_on_path(tmp_path: Path) -> None:
    # vng starts virtme-run by name: from .venv, unactivated, PATH finds none (or another
    # installation's); the harness puts vng's folder first
    from pycxl.testbed.kernel import find_kernel, vng_command
    from pycxl.testbed.runner import vng_environment

    vng, kernel = vng_command(), find_kernel()
    if vng is None or kernel is None:
        said = "the testbed is not set up (pycxl testbed --setup)"
        if os.environ.get("PYCXL_REQUIRE_TESTBED") == "1":
            pytest.fail(said, pytrace=False)
        pytest.skip(said)
    env = vng_environment(vng, {"PATH": BASE_PATH, "HOME": str(tmp_path)})
    assert env["PATH"] == f"{Path(vng).parent}:{BASE_PATH}"
    p = subprocess.run([vng, "--run", str(kernel.image), "--disable-microvm", "--disable-kvm",
                        "--dry-run", "--exec", "true"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert p.returncode == 0 and "not found" not in p.stderr, p.stderr[-2000:]


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
