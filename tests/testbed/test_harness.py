"""The testbed harness itself, on the host: a boot where the guest has no script I/O
ports (a host without udev) still returns the command's output and exit status; a guest
that stops in the middle of the kernel tests is booted again and the tests resume; a guest
that makes no progress for the harness's limit is treated the same way, and the limit
follows progress, not the wall clock.

The host's udevd is hidden from the guest by a private mount namespace (the guest sees
the host's file system through QEMU), so this runs the same with or without udev
installed. Needs root (mount namespace) and the testbed's requirements.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pycxl.testbed import GuestResult, progress
from pycxl.testbed.kernel import UDEVD_PATHS, missing_requirements
from tests.conftest import GUEST_PYTEST_ENV

PROBE = """
import json, sys
from pycxl.testbed import run_in_guest
r = run_in_guest("echo to-stdout; echo to-stderr >&2; exit 3")
vng = (r.workdir / "vng.log").read_text(errors="replace")
print(json.dumps({"rc": r.returncode, "output": r.output, "boots": r.boots, "vng": vng}))
"""


def _require_testbed() -> None:
    missing = missing_requirements()
    if missing or os.geteuid() != 0 or shutil.which("unshare") is None:
        why = "; ".join(missing) or "needs root and unshare (util-linux)"
        if os.environ.get("PYCXL_REQUIRE_TESTBED") == "1":
            pytest.fail(f"testbed required: {why}", pytrace=False)
        pytest.skip(f"testbed unavailable: {why}")


def test_guest_without_udev_reports_output_and_status(tmp_path: Path) -> None:
    _require_testbed()
    blank = tmp_path / "no-udevd"
    blank.write_text("")  # not executable: virtme-init finds no udevd
    hide = "; ".join(f"mount --bind {blank} {p}" for p in UDEVD_PATHS if os.path.exists(p))
    script = f"{hide or 'true'}; exec {sys.executable} -c '{PROBE}'"
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["rc"] == 3
    assert result["boots"] == 1
    assert "to-stdout" in result["output"] and "to-stderr" in result["output"]
    # the guest really had no output channel: its exit line never reached virtme-ng
    assert "PYCXL-TESTBED-EXIT" not in result["vng"]


def _run_probe(probe: str, **kwargs: float) -> GuestResult:
    from pycxl.testbed import run_in_guest

    root = Path(__file__).resolve().parents[2]
    env = dict(GUEST_PYTEST_ENV)
    if "timeout" in kwargs:
        env["PYCXL_PROBE_STALL_S"] = str(kwargs["timeout"])
    return run_in_guest(f"{sys.executable} -m pytest -q -p no:cacheprovider {probe}",
                        cwd=str(root), env=env, **kwargs)  # fmt: skip


def _calls(r: GuestResult) -> list[tuple[str, str]]:
    """(test name, outcome) of each test's call phase, in the order the guest ran them."""
    return [(rec["nodeid"].split("::")[1], rec["outcome"]) for rec in progress.outcomes(r.workdir)
            if rec["when"] == "call"]  # fmt: skip


def test_a_stopped_guest_boots_again_and_the_tests_resume() -> None:
    """The guest stops in the middle of a walk-through (resume_probe.py), as the
    emulator does when it crashes. The harness boots again; the finished test is not run
    again, and the walk-through runs again from its first step, in the fresh guest. A
    test that stops the guest each time it runs fails after two boots, and the test after
    it runs."""
    _require_testbed()
    r = _run_probe("tests/testbed/resume_probe.py")
    assert r.boots == 4, r.output
    assert r.returncode == 1, r.output  # the test given up fails in the guest's pytest
    walk = "test_walk[Step(doc='probe.md', line={}, where='testbed')]"
    assert _calls(r) == [
        ("test_finishes_in_the_first_boot", "passed"),  # boot 1
        (walk.format(1), "passed"),  # then step 2 stopped it
        (walk.format(1), "passed"),  # boot 2, from step 1
        (walk.format(2), "passed"),
        (walk.format(3), "passed"),
        ("test_runs_after_the_stop", "passed"),  # then the next test stopped it, and in boot 3
        ("test_stops_the_guest_every_time", "failed"),  # boot 4: given up
        ("test_runs_after_the_one_given_up", "passed"),
    ], r.output
    given_up = [rec["text"] for rec in progress.outcomes(r.workdir)
                if rec["nodeid"].endswith("test_stops_the_guest_every_time")]  # fmt: skip
    assert "stopped while this test ran, in two boots (boot 2: the emulator stopped" in given_up[0]
    assert "boot 3: the emulator stopped" in given_up[0]
    assert "deselected" in r.output  # a later boot did not run the finished tests again


def test_a_slow_guest_is_resumed_like_a_stopped_one() -> None:
    """A guest slowed on purpose (slow_probe.py): its first two tests take 0.6 of the
    progress limit each, so the boot runs well past the limit and still goes on (the limit
    follows progress); the next test is slow once, past the limit: the harness ends that
    boot, boots again and the session resumes at that test, which now passes."""
    _require_testbed()
    limit = 90.0
    r = _run_probe("tests/testbed/slow_probe.py", timeout=limit)
    assert r.returncode == 0, r.output
    assert r.boots == 2, r.output
    step = "test_slow_step[{}]"
    assert _calls(r) == [
        (step.format(1), "passed"),
        (step.format(2), "passed"),
        ("test_slow_once", "passed"),  # boot 2
        ("test_runs_after_the_slow_one", "passed"),
    ], r.output
    steps = [rec["duration_s"] for rec in progress.outcomes(r.workdir)
             if rec["nodeid"].split("::")[1].startswith("test_slow_step")]  # fmt: skip
    assert sum(steps) > limit  # boot 1 outlived the limit while it made progress
    ((boot, reason),) = [(x["boot"], x["reason"]) for x in progress.stops(r.workdir)]
    assert boot == 1 and reason.startswith("no progress for "), reason
    assert "2 deselected" in r.output  # boot 2 did not run the slow steps again


TERMINATED = """
import sys
from pathlib import Path
from pycxl.testbed import run_in_guest
run_in_guest("sleep 600", workdir=Path(sys.argv[1]))
"""


def test_a_terminated_harness_leaves_no_emulator_running() -> None:
    """SIGTERM to the harness (a cancelled CI job) while the guest runs: the harness
    exits with 143 and the emulator it started is gone."""
    _require_testbed()
    from pycxl.testbed.runner import new_workdir

    workdir = new_workdir("two-dev")
    proc = subprocess.Popen([sys.executable, "-c", TERMINATED, str(workdir)])
    try:
        deadline = time.monotonic() + 900
        while not (workdir / "started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no boot"
            time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _processes_of(workdir) == []


def _processes_of(workdir: Path) -> list[str]:
    """Command lines of the processes that name ``workdir`` (the emulator does)."""
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(workdir).encode() in cmdline:
            left.append(cmdline.replace(b"\0", b" ")[:120].decode(errors="replace"))
    return left


def test_a_boot_stopped_from_another_thread_ends_and_leaves_no_emulator() -> None:
    """The session runs its boots in threads, which take no signal: run_in_guest(stop=)
    ends a boot when the event is set, raises TestbedError, and the emulator is gone."""
    _require_testbed()
    from pycxl.base.errors import TestbedError
    from pycxl.testbed import run_in_guest
    from pycxl.testbed.runner import new_workdir

    workdir = new_workdir("two-dev")
    stop = threading.Event()

    def stop_once_started() -> None:
        deadline = time.monotonic() + 900
        while not (workdir / "started").exists() and time.monotonic() < deadline:
            time.sleep(1)
        stop.set()

    threading.Thread(target=stop_once_started, daemon=True).start()
    began = time.monotonic()
    with pytest.raises(TestbedError, match="stopped before the command ended"):
        run_in_guest("sleep 600", workdir=workdir, stop=stop)
    assert time.monotonic() - began < 600  # it did not wait for the command
    assert (workdir / "started").exists()
    assert _processes_of(workdir) == []
