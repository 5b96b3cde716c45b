"""A region creation that loses the race for the root decoder (EBUSY, as the kernel
answers a second creator) re-plans until it wins or its window closes, on a recorded
tree; the testbed runs the real race (tests/kernel/test_e_region_four.py)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

from pycxl.base.errors import SysfsError
from pycxl.base.plan import PlanFailed, Step
from pycxl.base.sysfs import Sysfs
from pycxl.cxl import regions
from pycxl.cxl.region_layout import RegionRequest

TREE = Path(__file__).resolve().parents[1] / "data" / "trees" / "two-dev" / "fresh"
CLAIM = "/sys/bus/cxl/devices/decoder0.0/create_ram_region"


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sysfs:
    shutil.copytree(TREE, tmp_path / "t", symlinks=True)
    monkeypatch.setattr(regions, "RACE_BACKOFF_S", 0.01)
    return Sysfs(tmp_path / "t")


def _request() -> RegionRequest:
    return RegionRequest(memdevs=(), ways=None, granularity=None, size=None, type=None,
                         decoder=None, bus=None, uuid=None, online=False, zone=None,
                         mode="system-ram")  # fmt: skip


def test_a_claim_lost_twice_is_undone_and_planned_again_until_it_is_won(tree: Sysfs) -> None:
    before = tree.read(CLAIM)
    claims: list[str] = []

    def another_creator_first(index: int, step: Step) -> None:
        if index == 0:
            claims.append(step.description)
            if len(claims) <= 2:
                raise SysfsError(step.path or "", "taken", errno.EBUSY)

    # the third claim is won; the recorded tree then has no region0 to set up, so the
    # next step fails as any failure does: undone and raised, not retried
    with pytest.raises(PlanFailed) as failed:
        regions.create_region(_request(), fs=tree, before_step=another_creator_first)
    assert claims == ["claim region0 from root decoder decoder0.0"] * 3
    assert failed.value.index == 1 and not isinstance(failed.value, regions.StayedBusy)
    assert tree.read(CLAIM) == before


def test_a_decoder_busy_past_the_window_is_refused_saying_what_holds_it(
    tree: Sysfs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(regions, "RACE_WINDOW_S", 0.2)
    before = tree.read(CLAIM)

    def always_busy(index: int, step: Step) -> None:
        raise SysfsError(step.path or "", "taken", errno.EBUSY)

    with pytest.raises(regions.StayedBusy) as failed:
        regions.create_region(_request(), fs=tree, before_step=always_busy)
    text = str(failed.value)
    assert failed.value.index == 0 and isinstance(failed.value, PlanFailed)
    assert "step 1 (claim region0" in text and "attempts over" in text
    assert "uncommitted" in text and "pycxl list --regions" in text
    assert tree.read(CLAIM) == before
