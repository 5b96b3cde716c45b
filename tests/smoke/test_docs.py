"""Every command and library example of the README and docs, run as a user types it:
with the defaults the docs show, through the installed ``pycxl``, on this host; CXL ones
inside the real-kernel testbed, GPU ones where a GPU is. Each must exit as documented,
print no traceback, and print what the docs show (the same table columns, the same JSON
keys). See examples.py for how the docs mark where an example runs.

In the testbed the emulated CXL memory moves at a few MB/s, so examples there run with
PYCXL_BENCH_QUICK=1, the documented way to shrink benchmark defaults (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pycxl.base.errors import NotAvailableError
from tests.smoke.examples import ROOT, Example, examples, shape_problems

ALL = list(examples())
TIMEOUT_S = 900


def _params(where: str) -> list[object]:
    out: list[object] = []
    for ex in ALL:
        if ex.where != where:
            continue
        marks = []
        if where == "testbed":
            marks.append(pytest.mark.kernel(topology=ex.topology))
        elif where == "gpu":
            marks.append(pytest.mark.gpu)
        out.append(pytest.param(ex, id=ex.id, marks=marks))
    return out


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # the pycxl a user runs: the console script beside this interpreter
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("PYCXL_SYSROOT", None)
    env.update(extra)
    return env


def run_example(ex: Example, **env: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", ex.text] if ex.kind == "python" else ["sh", "-c", ex.text]
    return subprocess.run(argv, cwd=ROOT, env=_env(**env), capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)  # fmt: skip


def check(ex: Example, p: subprocess.CompletedProcess[str]) -> None:
    said = f"{ex.id}: {ex.text}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    assert p.returncode == ex.exit, said
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr, said
    assert shape_problems(ex, p.stdout) == [], said


def test_the_docs_have_examples_everywhere() -> None:
    docs = {ex.doc for ex in ALL}
    assert {"README.md", "cli.md", "regions.md", "numa.md", "benchmarks.md", "gpu.md",
            "testbed.md", "architecture.md", "operations.md",
            "gpu-cxl.md"} <= docs, docs  # fmt: skip
    assert sum(ex.where == "testbed" for ex in ALL) >= 10
    assert all(ex.text.strip() for ex in ALL)


def test_pycxl_is_the_installed_console_script() -> None:
    exe = shutil.which("pycxl", path=_env()["PATH"])
    assert exe is not None and Path(exe).read_text(errors="replace").startswith("#!")


@pytest.mark.parametrize("ex", _params("host"))
def test_host_example(ex: Example) -> None:
    check(ex, run_example(ex))


_started: set[str] = set()


@pytest.mark.parametrize("ex", _params("testbed"))
def test_testbed_example(ex: Example) -> None:
    if ex.doc not in _started:  # each doc's walk-through starts from no regions
        from tests.kernel.kernel_helpers import destroy_all_regions

        destroy_all_regions()
        _started.add(ex.doc)
    check(ex, run_example(ex, PYCXL_BENCH_QUICK="1"))


@pytest.mark.parametrize("ex", _params("gpu"))
def test_gpu_example(ex: Example) -> None:
    check(ex, run_example(ex))


@pytest.mark.parametrize("ex", _params("nogpu"))
def test_example_without_a_gpu(ex: Example) -> None:
    from pycxl.base._lib.libs import LIBCUDA

    if LIBCUDA.available():
        pytest.skip("a CUDA driver is present: this example shows the path without one")
    check(ex, run_example(ex))


@pytest.mark.parametrize("ex", _params("harness"))
def test_example_with_the_testbed_harness(ex: Example) -> None:
    from pycxl.testbed import check_requirements

    try:
        check_requirements()
    except NotAvailableError as e:
        if os.environ.get("PYCXL_REQUIRE_TESTBED") == "1":
            raise
        pytest.skip(f"testbed unavailable: {e}")
    check(ex, run_example(ex))


@pytest.mark.parametrize("ex", _params("nocxl"))
def test_example_without_cxl(ex: Example) -> None:
    if os.path.isdir("/sys/bus/cxl"):
        pytest.skip("this host has a CXL bus: this example shows the path without one")
    check(ex, run_example(ex))
