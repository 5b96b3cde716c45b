"""Test layers: unit tests on recorded trees run here; tests marked ``kernel`` run
inside the real-kernel testbed (one boot per topology serves all of them) and report
back; tests marked ``gpu`` need a CUDA driver.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

TREES = Path(__file__).parent / "data" / "trees"
IN_GUEST = os.environ.get("PYCXL_IN_TESTBED") == "1"
REPORTING = IN_GUEST and os.environ.get("PYCXL_GUEST_REPORT") == "1"
# The guest's pytest loads no third-party plugin: under TCG, pytest-benchmark's start-up
# took 234 s and hypothesis's 45 s of a boot, where pytest alone starts in 17 s.
GUEST_PYTEST_ENV = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYCXL_GUEST_REPORT": "1",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
}


@pytest.fixture
def trees() -> Path:
    return TREES


def _marked_topologies(marker: pytest.Mark) -> tuple[str, ...]:
    """kernel(topology="two-dev") or kernel(topology=("two-dev", "two-socket"))."""
    value = marker.kwargs.get("topology") or (marker.args[0] if marker.args else "two-dev")
    return (value,) if isinstance(value, str) else tuple(value)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A kernel test marked for several topologies runs once in each one's boot."""
    m = metafunc.definition.get_closest_marker("kernel")
    topologies = _marked_topologies(m) if m is not None else ()
    if len(topologies) > 1:
        metafunc.fixturenames.append("testbed_topology")
        metafunc.parametrize("testbed_topology", topologies)


def _topology_of(item: pytest.Item) -> str | None:
    m = item.get_closest_marker("kernel")
    if m is None:
        return None
    params = getattr(item, "callspec", None)
    if params is not None and "testbed_topology" in params.params:
        return str(params.params["testbed_topology"])
    return _marked_topologies(m)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if REPORTING:
        _resume(config, items)
    by_topology: dict[str, list[str]] = defaultdict(list)
    for item in items:
        topo = _topology_of(item)
        if topo is not None:
            by_topology[topo].append(item.nodeid)
        elif item.get_closest_marker("gpu") and not _cuda_present():
            item.add_marker(pytest.mark.skip(reason="no CUDA driver on this machine (GPU test)"))
        elif (need := item.get_closest_marker("gpus")) and _gpu_count() < need.args[0]:
            item.add_marker(pytest.mark.skip(
                reason=f"needs {need.args[0]} GPUs; this machine has {_gpu_count()}"))  # fmt: skip
    config._pycxl_kernel_tests = dict(by_topology)  # type: ignore[attr-defined]
    config._pycxl_guest_results = {}  # type: ignore[attr-defined]


def _gpu_count() -> int:
    from pycxl.system import snapshot

    return len(snapshot().gpus.devices) if _cuda_present() else 0


def _cuda_present() -> bool:
    from pycxl._lib.libs import LIBCUDA

    return LIBCUDA.available()


# --- host side: run kernel tests in the guest, report their outcomes here -----------
@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    topo = _topology_of(pyfuncitem)
    if topo is None or IN_GUEST:
        return None
    results = _guest_results(pyfuncitem.config, topo)
    res = results.get(pyfuncitem.nodeid)
    if res is None:
        pytest.fail(
            f"the testbed guest did not report this test; guest output:\n"
            f"{results.get('__output__', {}).get('text', '')[-3000:]}",
            pytrace=False,
        )
    if res["outcome"] == "skipped":
        pytest.skip(f"in the testbed: {res['text']}")
    if res["outcome"] != "passed":
        pytest.fail(f"in the testbed ({topo}):\n{res['text']}", pytrace=False)
    return True


def _guest_results(config: pytest.Config, topo: str) -> dict[str, Any]:
    cache: dict[str, dict[str, Any]] = config._pycxl_guest_results  # type: ignore[attr-defined]
    if topo in cache:
        return cache[topo]
    from pycxl.errors import NotAvailableError, TestbedError
    from pycxl.testbed import check_requirements, run_in_guest

    try:
        check_requirements()
    except NotAvailableError as e:
        if os.environ.get("PYCXL_REQUIRE_TESTBED") == "1":
            pytest.fail(str(e), pytrace=False)
        pytest.skip(f"testbed unavailable: {e}")
    from pycxl.testbed import progress
    from pycxl.testbed.runner import new_workdir

    nodeids = config._pycxl_kernel_tests[topo]  # type: ignore[attr-defined]
    cmd = shlex.join([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *nodeids])
    workdir = new_workdir(topo)
    try:
        result = run_in_guest(
            cmd,
            topo,
            cwd=str(config.rootpath),
            env=GUEST_PYTEST_ENV,
            workdir=workdir,
        )
        output = result.output
        said = f"{result.boots} boot(s), guest pytest exit {result.returncode}"
    except TestbedError as e:
        # What the guest reported before its boots stopped still stands; the tests it
        # never reported fail with this error (remembered, so they report it instead
        # of booting again one by one).
        output, said = str(e), "the guest stopped before it finished"
    out: dict[str, Any] = {"__output__": {"text": output}}
    for rec in progress.outcomes(workdir):
        prev = out.get(rec["nodeid"])
        # a failure in any phase (setup, call, teardown) fails the test
        if prev is None or prev["outcome"] == "passed":
            out[rec["nodeid"]] = rec
    sys.stderr.write(f"\n[testbed {topo}: {len(nodeids)} tests, {said}]\n")
    cache[topo] = out
    return out


def _resume(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a later boot (an earlier one was cut short: the emulator stopped, or the guest
    made no progress for too long), run only what earlier boots did not finish: the test
    that was running when a boot stopped runs again, from a fresh guest, and finished ones
    keep their reported outcome. A docs walk-through is one unit (its lines build on each
    other): cut short, it runs again from its start. A test that was running when two
    boots stopped is not run a third time: it fails, saying why, and the rest go on."""
    from pycxl.testbed import progress

    workdir = Path(os.environ["PYCXL_TESTBED_WORKDIR"])
    done = progress.finished(workdir)
    unfinished = {_resume_unit(item) for item in items if item.nodeid not in done}
    keep = [item for item in items if _resume_unit(item) in unfinished]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
    stopped = progress.stopped_in(workdir)
    for item in items:
        boots = stopped.get(item.nodeid, [])
        if len(boots) >= 2:
            why = progress.stop_reasons(workdir, boots)
            item.runtest = functools.partial(  # type: ignore[method-assign]
                pytest.fail,
                f"the guest stopped while this test ran, in two boots ({why}); not run again",
                pytrace=False,
            )


def _resume_unit(item: pytest.Item) -> str:
    """What runs again as a whole after a crash: a doc's testbed walk-through, or a test."""
    params = getattr(item, "callspec", None)
    example = params.params.get("ex") if params is not None else None
    if example is not None and getattr(example, "where", None) == "testbed":
        return f"walk-through {example.doc}"
    return item.nodeid


# --- guest side: record each test's start and outcome for the host -----------------
def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if REPORTING:
        from pycxl.testbed import progress

        progress.record_start(Path(os.environ["PYCXL_TESTBED_WORKDIR"]), nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not REPORTING:
        return
    if report.when != "call" and report.outcome == "passed":
        return
    text = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2])
    elif report.longrepr is not None:
        text = str(report.longrepr)
    rec = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "text": text,
           "duration_s": round(report.duration, 3)}  # fmt: skip
    from pycxl.testbed import progress

    progress.record(Path(os.environ["PYCXL_TESTBED_WORKDIR"]), rec)
