"""The plan executor: steps run in order; a failure undoes the done ones, newest first."""

from __future__ import annotations

from pathlib import Path

import pytest

from pycxl.base.errors import OperationError
from pycxl.base.plan import Plan, PlanFailed, action, write
from pycxl.base.sysfs import Sysfs


def _tree(tmp_path: Path) -> Sysfs:
    (tmp_path / "sys" / "devices").mkdir(parents=True)  # what makes it a sysfs tree
    for name in ("a", "b", "c"):
        (tmp_path / name).write_text("0")
    return Sysfs(tmp_path)


def _plan(log: list[str]) -> Plan:
    def act(fs: Sysfs) -> object:
        log.append("act")
        return lambda f: log.append("unact")

    return Plan("t", (
        write("set a", "/a", "1", ("/a", "0")),
        write("set b", "/b", "1", ("/b", "0")),
        action("act", act),  # type: ignore[arg-type]
        write("set c", "/c", "1", ("/c", "0")),
    ))  # fmt: skip


def _state(fs: Sysfs) -> list[str | None]:
    return [fs.read(f"/{n}") for n in "abc"]


def test_all_steps_run_in_order(tmp_path: Path) -> None:
    fs, log = _tree(tmp_path), []
    _plan(log).execute(fs)
    assert _state(fs) == ["1", "1", "1"] and log == ["act"]


@pytest.mark.parametrize("fail_at", range(4))
def test_failure_at_each_step_restores_the_files(tmp_path: Path, fail_at: int) -> None:
    fs, log = _tree(tmp_path), []

    def hook(i: int, _step: object) -> None:
        if i == fail_at:
            raise OperationError("injected")

    with pytest.raises(PlanFailed, match=rf"step {fail_at + 1} \(.*\) failed: injected") as e:
        _plan(log).execute(fs, before_step=hook)
    assert _state(fs) == ["0", "0", "0"]
    assert e.value.undo_errors == []
    assert log == (["act", "unact"] if fail_at == 3 else [])


def test_failed_write_names_the_file_and_undo_failures_are_reported(tmp_path: Path) -> None:
    fs = _tree(tmp_path)
    plan = Plan("t", (
        write("set a", "/a", "1", ("/missing-dir/x", "0")),
        write("set d", "/no-such-dir/d", "1"),
    ))  # fmt: skip
    with pytest.raises(PlanFailed) as e:
        plan.execute(fs)
    assert "/no-such-dir/d" in str(e.value) and "could NOT undo: set a" in str(e.value)
    assert plan.show()[0].startswith(" 1. /a <- '1'")
