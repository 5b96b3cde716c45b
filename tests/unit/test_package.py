"""Package contracts: light import, lazy bindings, exit codes, static checks."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pycxl.base._lib.loader import SharedLibrary
from pycxl.base.errors import LibraryNotFoundError

ROOT = Path(__file__).resolve().parents[2]
TWO_DEV = ROOT / "tests" / "data" / "trees" / "two-dev" / "region"


def test_import_loads_no_library_and_no_numpy() -> None:
    code = (
        "import sys, pycxl, pycxl.cxl, pycxl.resolve.tiers, pycxl.resolve.system\n"
        "maps = open('/proc/self/maps').read()\n"
        "bad = [m for m in ('numpy', '_cffi_backend', 'cffi') if m in sys.modules]\n"
        "libs = [l for l in ('libcxl', 'libnuma', 'libcuda') if l in maps]\n"
        "print(bad, libs)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] []"


def test_missing_library_names_the_package() -> None:
    lib = SharedLibrary(("libdoesnotexist.so.9",), "libnuma", "the package libdoesnotexist9")
    with pytest.raises(LibraryNotFoundError, match="install the package libdoesnotexist9"):
        lib.load()
    assert lib.available() is False


def test_real_libraries_load() -> None:
    from pycxl.base._lib.libs import LIBCXL, LIBNUMA
    from pycxl.base._lib.loader import has_symbol

    _, numa = LIBNUMA.load()
    assert numa.numa_available() >= 0
    if not LIBCXL.available() and os.environ.get("PYCXL_REQUIRE_TESTBED") != "1":
        pytest.skip("libcxl1 is not installed here (scripts/setup-test-env.sh installs it)")
    _, cxl = LIBCXL.load()
    # Debian's libcxl 76.1 spells it 'verison' and lacks create_ram_region: feature-detect.
    assert has_symbol(cxl, "cxl_memdev_get_firmware_verison") or has_symbol(
        cxl, "cxl_memdev_get_firmware_version"
    )
    assert isinstance(has_symbol(cxl, "cxl_decoder_create_ram_region"), bool)


def test_gpus_absent_is_reported_not_raised() -> None:
    from pycxl.base._lib.libs import LIBCUDA
    from pycxl.gpu import read_gpus

    if LIBCUDA.available():
        pytest.skip("a CUDA driver is present here")
    inv = read_gpus()
    assert inv.devices == () and inv.absent_reason == "no CUDA driver (libcuda.so.1 not found)"
    p = subprocess.run([sys.executable, "-m", "pycxl.cli.main", "list", "-G"],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert p.returncode == 0 and "no CUDA driver" in p.stdout


def test_console_script_installed() -> None:
    exe = shutil.which("pycxl") or str(Path(sys.executable).parent / "pycxl")
    p = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    assert p.returncode == 0 and p.stdout.startswith("pycxl, version")


RUN = """
import atexit, sys
atexit.register(lambda: print("atexit ran", file=sys.stderr))
sys.argv = ["pycxl", *sys.argv[1:]]
from pycxl.cli.main import run
run()
"""


@pytest.mark.parametrize(("args", "code"), [(["list", "--json", "--sysroot", str(TWO_DEV)], 0),
                                           (["list", "--no-such-flag"], 2)])  # fmt: skip
def test_the_console_scripts_quick_exit_keeps_status_output_and_atexit(
    args: list[str], code: int
) -> None:
    """run() (the console script) freezes the garbage collector before exit: the exit
    status, every byte of output and the atexit handlers are as main() leaves them."""
    from pycxl.cli.main import main

    p = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True,
                       check=False)  # fmt: skip
    assert p.returncode == code, p.stderr
    assert p.stderr.splitlines()[-1] == "atexit ran"
    if code == 0:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(args) == 0
        assert json.loads(p.stdout) == json.loads(out.getvalue())
    else:
        assert "No such option" in p.stderr


@pytest.mark.parametrize("tool", [["ruff", "check", "."], ["ruff", "format", "--check", "."],
                                  ["mypy"]])  # fmt: skip
def test_static_checks(tool: list[str]) -> None:
    p = subprocess.run([sys.executable, "-m", *tool], cwd=ROOT, capture_output=True, text=True,
                       check=False)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_package_is_installed() -> None:
    """pyproject.toml lists packages by name: one left out is missing from every install
    (the source tree's tests would not notice)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])  # fmt: skip
    found = {"pycxl." + ".".join(p.parent.relative_to(ROOT / "pycxl").parts)
             for p in (ROOT / "pycxl").rglob("__init__.py")}  # fmt: skip
    found = {f.rstrip(".") for f in found}
    assert found - listed == set(), found - listed
