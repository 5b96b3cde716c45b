"""What the testbed guest's script exports (pycxl.testbed.runner.guest_environment)."""

from __future__ import annotations

from pathlib import Path

from pycxl.testbed.runner import guest_environment


def test_the_guest_binds_symbols_at_start_up(tmp_path: Path) -> None:
    # QEMU 10.0 segfaults on the FPU-state save of ld.so's lazy binding when a stack
    # mixes DRAM and CXL pages (docs/testbed.md); every guest program binds up front
    env = guest_environment("two-dev", 2, "true", tmp_path, cwd="/src")
    assert env["LD_BIND_NOW"] == "1"
    assert env["PYCXL_EXPECT_MEMDEVS"] == "2" and env["PYCXL_GUEST_CWD"] == "/src"
    assert env["PYCXL_TESTBED_WORKDIR"] == str(tmp_path)


def test_a_callers_variables_come_last(tmp_path: Path) -> None:
    env = guest_environment("two-dev", 2, "true", tmp_path, env={"PYCXL_GUEST_REPORT": "1"})
    assert env["PYCXL_GUEST_REPORT"] == "1" and env["LD_BIND_NOW"] == "1"


def test_progress_tells_the_unit_each_stopped_boot_was_running(tmp_path: Path) -> None:
    # the records a guest pytest and the host leave in the work directory over three boots
    from pycxl.testbed import progress

    progress.record_start(tmp_path, "t::a")
    progress.record(tmp_path, {"nodeid": "t::a", "when": "call", "outcome": "passed"})
    progress.record_start(tmp_path, "t::b")  # boot 1 stops here
    progress.note_stop(tmp_path, 1, "no progress for 900 s")
    assert progress.current_boot(tmp_path) == 2
    progress.record_start(tmp_path, "t::b")  # and boot 2 too
    progress.note_stop(tmp_path, 2, "the emulator stopped")
    with (tmp_path / progress.REPORT).open("a") as f:
        f.write('{"nodeid": "t::c", "when": "st')  # a line the stopped guest cut short
    assert progress.finished(tmp_path) == {"t::a"}
    assert progress.stopped_in(tmp_path) == {"t::b": [1, 2]}
    assert progress.stop_reasons(tmp_path, [1, 2]) == (
        "boot 1: no progress for 900 s; boot 2: the emulator stopped"
    )


def test_the_progress_clock_counts_the_groups_cpu_time() -> None:
    # a child in a group of its own burns CPU; the clock sees it, and a limit below what
    # it used has expired by CPU time (the wall clock alone would not say so yet)
    import os
    import subprocess
    import sys
    import time

    from pycxl.testbed.clock import ProgressClock, group_cpu_s

    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.process_time()\n"
         "while time.process_time() - t < 1.0: pass\nimport sys; sys.stdin.read()"],
        stdin=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        clock = ProgressClock(child.pid, limit_s=0.3)
        start, deadline = group_cpu_s(child.pid), time.monotonic() + 30
        while group_cpu_s(child.pid) < start + 0.4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert group_cpu_s(child.pid) >= start + 0.4
        late = clock.expired()
        assert late is not None and "of emulator CPU time" in late, late
        clock.progress()
        assert clock.expired() is None
        assert group_cpu_s(os.getpgid(0)) > 0  # this test's own group
    finally:
        child.kill()
        child.wait()
