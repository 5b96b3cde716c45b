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
