"""Test layers: unit tests on recorded trees run here; tests marked ``kernel`` run
inside the real-kernel testbed (one boot per topology serves all of them) and report
back; tests marked ``gpu`` need a CUDA driver.
"""

from __future__ import annotations

import functools
import os
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
    for item in items:
        if _topology_of(item) is not None:
            continue
        if item.get_closest_marker("gpu") and not _cuda_present():
            item.add_marker(pytest.mark.skip(reason="no CUDA driver on this machine (GPU test)"))
        elif (need := item.get_closest_marker("gpus")) and _gpu_count() < need.args[0]:
            item.add_marker(pytest.mark.skip(
                reason=f"needs {need.args[0]} GPUs; this machine has {_gpu_count()}"))  # fmt: skip


def _plan_guests(items: list[pytest.Item]) -> list[Any]:
    """Host side, on the session's final list of tests: the testbed batches, and the
    host's own tests first, so that they run while the guests boot and work."""
    from tests import guests

    units: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for item in items:
        topo = _topology_of(item)
        if topo is not None:
            units[topo].setdefault(_resume_unit(item), []).append(item.nodeid)
    batches = guests.plan_batches({t: list(u.items()) for t, u in units.items()},
                                  guests.recorded_durations(), guests.guests_at_once())  # fmt: skip
    place = {n: i for i, b in enumerate(batches) for n in b.nodeids}
    items.sort(key=lambda item: place.get(item.nodeid, -1))  # stable: host tests keep order
    return batches


def _gpu_count() -> int:
    from pycxl.resolve.system import snapshot

    return len(snapshot().gpus.devices) if _cuda_present() else 0


def _cuda_present() -> bool:
    from pycxl.base._lib.libs import LIBCUDA

    return LIBCUDA.available()


# --- host side: run kernel tests in the guest, report their outcomes here -----------
@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    topo = _topology_of(pyfuncitem)
    if topo is None or IN_GUEST:
        return None
    results = _guest_results(pyfuncitem.config, pyfuncitem.nodeid)
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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Host side: the testbed's boots start now, beside the host's own tests."""
    config = session.config
    if IN_GUEST or config.option.collectonly:
        return
    batches = _plan_guests(session.items)
    config._pycxl_unavailable = None  # type: ignore[attr-defined]
    if not batches:
        return
    from pycxl.base.errors import NotAvailableError
    from pycxl.testbed import check_requirements

    try:
        check_requirements()
    except NotAvailableError as e:
        config._pycxl_unavailable = str(e)  # type: ignore[attr-defined]
        return
    import compileall
    import functools

    from tests import guests

    # the guests' Pythons cannot write bytecode (the host's files are read-only there):
    # compiled once here, each of their many starts reads it
    for folder in ("pycxl", "cli", "tests"):
        compileall.compile_dir(config.rootpath / folder, quiet=2, workers=1)
    run = functools.partial(guests.run_batch, rootpath=config.rootpath, env=GUEST_PYTEST_ENV)
    config._pycxl_guests = guests.GuestRuns(batches, run)  # type: ignore[attr-defined]
    _end_on_sigterm()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """How each testbed boot went, beside the results (the tests' own output is captured)."""
    runs = getattr(config, "_pycxl_guests", None)
    for line in runs.told() if runs is not None else ():
        terminalreporter.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    runs = getattr(config, "_pycxl_guests", None)
    if runs is not None:
        runs.close()


def _end_on_sigterm() -> None:
    """SIGTERM and SIGHUP (a cancelled CI job) end the session as Ctrl-C does, so that
    pytest_unconfigure ends the boots: by default they end Python at once and the
    emulators, processes of their own, would run on."""
    import signal

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for s in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(s) == signal.SIG_DFL:
            signal.signal(s, interrupt)


def _guest_results(config: pytest.Config, nodeid: str) -> dict[str, Any]:
    unavailable = getattr(config, "_pycxl_unavailable", None)
    if unavailable is not None:
        if os.environ.get("PYCXL_REQUIRE_TESTBED") == "1":
            pytest.fail(unavailable, pytrace=False)
        pytest.skip(f"testbed unavailable: {unavailable}")
    runs = getattr(config, "_pycxl_guests", None)
    batch = runs.batch_of(nodeid) if runs is not None else None
    if runs is None or batch is None:
        pytest.fail("this kernel test was in no testbed batch of the session", pytrace=False)
    out: dict[str, Any] = runs.outcomes(batch)
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
