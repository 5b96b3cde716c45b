"""The testbed harness itself, on the host: a boot where the guest has no script I/O
ports (a host without udev) still returns the command's output and exit status; a guest
that stops in the middle of the kernel tests is booted again and the tests resume.

The host's udevd is hidden from the guest by a private mount namespace (the guest sees
the host's file system through QEMU), so this runs the same with or without udev
installed. Needs root (mount namespace) and the testbed's requirements.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pycxl.testbed.kernel import UDEVD_PATHS, missing_requirements

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


def test_a_stopped_guest_boots_again_and_the_tests_resume() -> None:
    """The guest stops in the middle of a walk-through (resume_probe.py), as the
    emulator does when it crashes. The harness boots again; the finished test is not run
    again, and the walk-through runs again from its first step, in the fresh guest."""
    _require_testbed()
    from pycxl.testbed import run_in_guest

    root = Path(__file__).resolve().parents[2]
    probe = "tests/testbed/resume_probe.py"
    r = run_in_guest(f"{sys.executable} -m pytest -q -p no:cacheprovider {probe}", cwd=str(root),
                     env={"PYTHONDONTWRITEBYTECODE": "1", "PYCXL_GUEST_REPORT": "1"})  # fmt: skip
    assert r.boots == 2, r.output
    assert r.returncode == 0, r.output
    records = map(json.loads, (r.workdir / "guest-report.jsonl").read_text().splitlines())
    calls = [rec["nodeid"].split("::")[1] for rec in records if rec["when"] == "call"]
    assert calls == [
        "test_finishes_in_the_first_boot",  # boot 1
        "test_walk[Step(doc='probe.md', line=1, where='testbed')]",  # then step 2 stopped it
        "test_walk[Step(doc='probe.md', line=1, where='testbed')]",  # boot 2, from step 1
        "test_walk[Step(doc='probe.md', line=2, where='testbed')]",
        "test_walk[Step(doc='probe.md', line=3, where='testbed')]",
        "test_runs_after_the_stop",
    ], calls
    assert "1 deselected" in r.output  # boot 2 did not run the finished test again
