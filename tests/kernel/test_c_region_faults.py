"""Failures in the middle of `region create` on the real kernel: whatever step fails,
the steps before it are undone and the CXL state equals the state before."""

from __future__ import annotations

import pytest

from pycxl.base.errors import InvalidRequestError, OperationError
from pycxl.base.plan import PlanFailed, Step
from pycxl.base.sysfs import Sysfs
from pycxl.cxl import regions
from pycxl.cxl.region_layout import RegionRequest
from pycxl.cxl.sysfs_backend import read_topology
from tests.kernel.kernel_helpers import cxl_state, destroy_all_regions, state_diff

REQ = RegionRequest(ways=2, zone="movable")  # movable: always removable again


@pytest.mark.kernel(topology="two-dev")
def test_failure_injected_at_every_step_is_undone() -> None:
    steps = len(regions.create_region(REQ, dry_run=True).plan)
    assert steps >= 14
    for k in range(steps):
        before = cxl_state()

        def fail_at_k(i: int, step: Step, k: int = k) -> None:
            if i == k:
                raise OperationError("injected failure")

        with pytest.raises(PlanFailed) as e:
            regions.create_region(REQ, before_step=fail_at_k)
        assert e.value.index == k and e.value.undo_errors == []
        assert state_diff(before, cxl_state()) == [], f"after a failure at step {k + 1}"


@pytest.mark.kernel(topology="two-dev")
def test_kernel_refusal_on_a_busy_decoder_is_undone() -> None:
    """Mid-plan, another creator makes a 1-way region of one of our memdevs. The kernel
    refuses our next write (EBUSY: that memdev's decoder is taken, or the other region
    now sits above our address range on the shared host bridge). The steps done are
    undone and the request is planned again from a fresh read, which then says the
    memdev is taken: nothing of ours is left."""
    before = cxl_state()
    layout = regions.create_region(REQ, dry_run=True).layout
    assert layout is not None
    victim = layout.targets[1]
    other: list[regions.RegionResult] = []
    seen: list[str] = []

    def other_creator(i: int, step: Step) -> None:
        seen.append(step.description)
        if i == 4 and not other:  # our name is claimed; our targets not yet set
            req = RegionRequest(memdevs=(f"{victim.memdev.serial:#x}",), online=False)
            other.append(regions.create_region(req))

    try:
        with pytest.raises(InvalidRequestError) as e:
            regions.create_region(REQ, before_step=other_creator)
        assert f"{victim.memdev.name} (0 B free, in {other[0].name})" in str(e.value), e.value
        assert len(seen) > 5  # the first attempt got past the other creator's region
        topo = read_topology()
        (theirs,) = topo.regions  # ours is gone, theirs is intact
        assert theirs.name == other[0].name and theirs.committed
        assert theirs.mappings[0].decoder == victim.decoder.name
    finally:
        destroy_all_regions()
    assert state_diff(before, cxl_state()) == []


@pytest.mark.kernel(topology="two-dev")
def test_losing_the_region_name_race_retries_with_the_next_name() -> None:
    fs = Sysfs()
    before = cxl_state()
    stolen: list[str] = []

    def competitor(i: int, step: Step) -> None:
        if i == 0 and not stolen:
            assert step.path is not None and step.value is not None
            fs.write(step.path, step.value)  # claims the name we were about to write
            stolen.append(step.value)

    result = regions.create_region(RegionRequest(ways=2, online=False), before_step=competitor)
    try:
        assert stolen and result.name != stolen[0]
        assert result.region is not None and result.region.committed
        other = Sysfs().read(f"/sys/bus/cxl/devices/{stolen[0]}/interleave_ways")
        assert other is not None  # the competitor's region is there, untouched
    finally:
        regions.destroy_region(result.name)
        root = result.region.decoder if result.region else "decoder0.0"
        for name in stolen:
            fs.write(f"/sys/bus/cxl/devices/{root}/delete_region", name)
    assert state_diff(before, cxl_state()) == []
