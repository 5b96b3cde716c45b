"""The testbed harness itself, on the host: a boot where the guest has no script I/O
ports (a host without udev) still returns the command's output and exit status; a guest
that stops in the middle of the kernel tests is booted again and the tests resume; a guest
that makes no progress for the harness's limit is treated the same way, and the limit
follows progress, not the wall clock; a terminated harness leaves no emulator behind.

Boots are what these tests cost (a boot and the guest pytest's start-up take a minute of
emulator CPU time on a busy host), so one session of the guest (boots_probe.py: three
boots, the first two cut short on purpose, each in its own way) serves the first five
tests; each checks its part of what that session did. The session runs with the host's
udevd hidden from the guest by a private mount namespace (the guest sees the host's file
system through QEMU), so it runs the same with or without udev installed, and every boot
of it returns through the work directory alone. Needs root (mount namespace) and the
testbed's requirements.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pycxl.testbed import progress
from pycxl.testbed.kernel import UDEVD_PATHS, missing_requirements
from tests.conftest import GUEST_PYTEST_ENV

ROOT = Path(__file__).resolve().parents[2]
# The probe session's progress limit, in seconds of emulator CPU time. The guest
# pytest's start-up took about 50 s of it on a 2-core host loaded with other work, with
# no output of its own: -X importtime has the interpreter print a line per module it
# imports, so the start-up shows progress, and the limit only has to outlast the probe's
# own silences (there, a step that ran the guest 9 s used 14-15 s of emulator CPU time).
LIMIT_S = 30.0
# -o addopts=: none of the host's options (xdist's -n) reach the guest's pytest
PROBE_COMMAND = (
    "echo to-stdout; echo to-stderr >&2; "
    f"{shlex.quote(sys.executable)} -X importtime -m pytest -q -p no:cacheprovider "
    "-o addopts= tests/testbed/boots_probe.py"
)
HARNESS = """
import json, sys
from pycxl.testbed import run_in_guest
command, cwd, env, limit = sys.argv[1:]
r = run_in_guest(command, cwd=cwd, env=json.loads(env), timeout=float(limit))
print(json.dumps({"rc": r.returncode, "output": r.output, "boots": r.boots,
                  "workdir": str(r.workdir)}))
"""
STOPPED = "the emulator stopped before the command ended"
WALK = "test_walk[Step(doc='probe.md', line={}, where='testbed')]"
STEPS = [f"test_slow_step[{n}]" for n in range(1, 7)]


def _require_testbed() -> None:
    missing = missing_requirements()
    if missing or os.geteuid() != 0 or shutil.which("unshare") is None:
        why = "; ".join(missing) or "needs root and unshare (util-linux)"
        if os.environ.get("PYCXL_REQUIRE_TESTBED") == "1":
            pytest.fail(f"testbed required: {why}", pytrace=False)
        pytest.skip(f"testbed unavailable: {why}")


@dataclass(frozen=True)
class Session:
    """What the harness returned for the probe session, and what its boots left."""

    rc: int
    output: str
    boots: int
    workdir: Path

    def runs(self) -> list[tuple[str, int, str | None]]:
        """(test name, boot, outcome of its call phase, or None where the boot stopped
        while it ran), in the order the guest ran them."""
        out: list[tuple[str, int, str | None]] = []
        at: dict[str, int] = {}  # test -> its index in out, while it runs
        for rec in progress.records(self.workdir):
            name = rec["nodeid"].split("::")[1]
            if rec["when"] == progress.START:
                at[name] = len(out)
                out.append((name, rec["boot"], None))
            elif rec["when"] == "call":
                i = at.pop(name)
                out[i] = (name, out[i][1], rec["outcome"])
        return out

    def stops(self) -> list[tuple[int, str]]:
        return [(s["boot"], s["reason"]) for s in progress.stops(self.workdir)]


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    """boots_probe.py in the guest, by a harness whose guest finds no udevd."""
    _require_testbed()
    blank = tmp_path_factory.mktemp("udev") / "no-udevd"
    blank.write_text("")  # not executable: virtme-init finds no udevd
    hide = "; ".join(f"mount --bind {blank} {p}" for p in UDEVD_PATHS if os.path.exists(p))
    env = {**GUEST_PYTEST_ENV, "PYCXL_PROBE_STALL_S": str(LIMIT_S)}
    harness = shlex.join([sys.executable, "-c", HARNESS, PROBE_COMMAND, str(ROOT),
                          json.dumps(env), str(LIMIT_S)])  # fmt: skip
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"{hide or 'true'}; exec {harness}"],
        capture_output=True, text=True, check=False, timeout=3600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return Session(r["rc"], r["output"], r["boots"], Path(r["workdir"]))


def test_guest_without_udev_reports_output_and_status(session: Session) -> None:
    """Each boot of the session ended with the command's exit status, read from the
    work directory, or where the probe cut it short on purpose; the last one returned the
    command's output, both streams, and its status (the guest pytest's: one test failed),
    though no exit line ever reached virtme-ng."""
    assert session.rc == 1, session.output[-3000:]
    assert "to-stdout" in session.output and "to-stderr" in session.output
    assert "1 failed, 3 passed, 7 deselected" in session.output  # the guest pytest's summary
    assert len(session.stops()) == session.boots - 1 == 2, session.stops()
    logs = sorted(session.workdir.glob("vng.log*"))
    assert len(logs) == session.boots
    # the guest really had no output channel: its exit line never reached virtme-ng
    assert not [p.name for p in logs if "PYCXL-TESTBED-EXIT" in p.read_text(errors="replace")]


def test_a_stopped_guest_boots_again_and_the_tests_resume(session: Session) -> None:
    """The guest stops in the middle of a walk-through (boot 2), as the emulator does
    when it crashes. The harness boots again; the finished tests are not run again, and
    the walk-through runs again from its first step, in the fresh guest."""
    boot, reason = session.stops()[1]
    assert boot == 2 and reason.startswith(STOPPED), reason
    assert session.runs() == [
        ("test_finishes_in_the_first_boot", 1, "passed"),
        *[(step, 1, "passed") for step in STEPS],
        (WALK.format(1), 1, "passed"),
        (WALK.format(2), 1, None),  # slow past the limit: the harness ended boot 1
        (WALK.format(1), 2, "passed"),  # boot 2, from step 1
        (WALK.format(2), 2, None),  # it stopped the guest
        (WALK.format(1), 3, "passed"),  # boot 3, from step 1 again
        (WALK.format(2), 3, "failed"),
        (WALK.format(3), 3, "passed"),  # step 1's state is there: it ran in this boot
        ("test_runs_after_the_walk", 3, "passed"),
    ], session.runs()


def test_a_test_that_stops_the_guest_twice_fails_and_the_next_goes_on(session: Session) -> None:
    """The walk-through's second step stopped boots 1 and 2: boot 3 does not run it a
    third time, reports it failed, naming both stops, and runs the tests after it."""
    assert session.boots == 3, session.output[-3000:]
    (given_up,) = [rec["text"] for rec in progress.outcomes(session.workdir)
                   if rec["nodeid"].endswith(WALK.format(2))]  # fmt: skip
    assert "stopped while this test ran, in two boots (boot 1: no progress for " in given_up
    assert "boot 2: the emulator stopped" in given_up
    assert session.runs()[-3:] == [
        (WALK.format(2), 3, "failed"),
        (WALK.format(3), 3, "passed"),
        ("test_runs_after_the_walk", 3, "passed"),
    ]
    assert session.rc == 1  # the test given up fails in the guest's pytest


def test_a_slow_guest_is_resumed_like_a_stopped_one(session: Session) -> None:
    """A step slow past the progress limit (boot 1): the harness ends that boot, boots
    again and the session resumes as after a crash: the tests that finished are not run
    again, the walk-through starts again, and the stop counts against the slow step as a
    crash would (boot 3 gives it up)."""
    boot, reason = session.stops()[0]
    assert boot == 1 and reason.startswith("no progress for "), reason
    boot2 = [(name, outcome) for name, boot, outcome in session.runs() if boot == 2]
    assert boot2 == [(WALK.format(1), "passed"), (WALK.format(2), None)], session.runs()


def test_the_limit_follows_progress(session: Session) -> None:
    """Boot 1 ran six steps that each kept the guest busy for 0.2 of the limit (counted
    in time the emulator ran the guest, so each used at least that much of the emulator's
    CPU time): the boot outlived the limit while it made progress, and ended only in the
    step that made none."""
    steps = [json.loads(line) for line in
             (session.workdir / "slow-steps.jsonl").read_text().splitlines()]  # fmt: skip
    assert [s["step"] for s in steps] == list(range(1, 7))
    assert all(s["ran_s"] < LIMIT_S for s in steps)
    assert sum(s["ran_s"] for s in steps) > LIMIT_S, steps
    boot1 = [(name, outcome) for name, boot, outcome in session.runs() if boot == 1]
    assert boot1[1:7] == [(step, "passed") for step in STEPS], boot1
    assert boot1[7:] == [(WALK.format(1), "passed"), (WALK.format(2), None)], boot1
    assert session.stops()[0][0] == 1


TERMINATED = """
import sys
from pathlib import Path
from pycxl.testbed import run_in_guest
run_in_guest("sleep 600", workdir=Path(sys.argv[1]))
"""


def _processes_of(workdir: Path) -> list[list[str]]:
    """The command lines of the processes that name this run directory (virtme-ng,
    QEMU and their helpers do)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(workdir).encode() in cmdline:
            found.append(cmdline.decode(errors="replace").split("\0"))
    return found


def test_a_terminated_harness_leaves_no_emulator_running() -> None:
    """SIGTERM to the harness (a cancelled CI job) while its emulator runs: the harness
    exits with 143 and the emulator it started is gone. The signal comes as soon as QEMU
    runs (the guest is booting): the harness ends a boot the same way in any phase."""
    _require_testbed()
    from pycxl.testbed.runner import new_workdir

    workdir = new_workdir("two-dev")
    proc = subprocess.Popen([sys.executable, "-c", TERMINATED, str(workdir)])
    try:
        deadline = time.monotonic() + 900
        while not [c for c in _processes_of(workdir) if "qemu-system" in c[0]]:
            assert proc.poll() is None and time.monotonic() < deadline, "no emulator"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    left = [" ".join(c)[:120] for c in _processes_of(workdir)]
    assert left == []
