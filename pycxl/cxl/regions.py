"""Region operations: create, destroy, enable, disable. Library API of ``pycxl region``.

Each call reads the topology, validates, builds a plan and (unless ``dry_run``)
executes it; a failed step undoes the ones before it. The result carries the region as
the kernel reports it afterwards, with its NUMA node and tier name once online.
"""

from __future__ import annotations

import errno
import random
import re
import time
from dataclasses import dataclass, field

from ..base._log import get_logger
from ..base.errors import (
    InvalidRequestError,
    NotAvailableError,
    SysfsError,
)
from ..base.plan import Plan, PlanFailed, StepHook, require_root
from ..base.sysfs import Sysfs
from ..base.values import PMEM, VOLATILE_MODES
from . import region_plan
from .dax import check_mode
from .memory_blocks import Zone, combine_zones
from .model import Region
from .read import bus_present, read_cxl
from .region_layout import RegionLayout, RegionRequest, layout_region
from .topology import CxlTopology

log = get_logger(__name__)

# A concurrent creator makes our writes fail with EBUSY at three points: claiming the
# region name (it took the name first); attaching a target (regions must sit on a port
# in address order, and it attached a region above the address we were given); commit
# (decoders of one port commit in id order, and it holds a lower one, not yet
# committed). Each is undone and re-planned from a fresh read of the topology, for as
# long as RACE_WINDOW_S: a creation takes seconds on a busy or emulated machine, and
# two losers that back off in step collide again, so each wait is jittered.
RACE_WINDOW_S = 60.0
RACE_BACKOFF_S = 0.5
RACE_BACKOFF_MAX_S = 3.0
_jitter = random.Random()  # its own: a caller's seed would put two creators in step again


class StayedBusy(PlanFailed):
    """Every attempt to create a region lost the race (EBUSY) until the window closed."""

    def __init__(self, failed: PlanFailed, attempts: int, seconds: float) -> None:
        super().__init__(failed.step, failed.index, failed.cause, failed.undo_errors)
        self.args = (
            f"{failed}; busy on each of {attempts} attempts over {seconds:.0f} s: another "
            "region is being created under the same ports, or a region left uncommitted "
            "holds a lower decoder there (pycxl list --regions shows it; destroy it)",
        )


_TARGET = re.compile(r"/region\d+/target\d+$")


@dataclass(frozen=True)
class RegionResult:
    """What an operation did (or, in a dry run, would do)."""

    name: str
    plan: Plan
    executed: bool
    region: Region | None = None  # as read back afterwards; None once destroyed
    layout: RegionLayout | None = None  # create only
    numa_node: int | None = None  # the node its memory is online in
    zone: str | None = None  # the zone it is online in: normal, movable or mixed
    tier: str | None = None  # that node's tier name (cxl0...), where names were resolved
    warnings: tuple[str, ...] = ()
    # the CXL objects as read back afterwards, for naming the tier without a third read
    topology: CxlTopology | None = field(default=None, repr=False, compare=False)


def create_region(
    request: RegionRequest,
    *,
    fs: Sysfs | None = None,
    dry_run: bool = False,
    before_step: StepHook | None = None,
) -> RegionResult:
    """Create, commit, bind and (by default) online a region. See ``RegionRequest``.
    ``fs``: the host tree to write (default: this machine's, or ``PYCXL_SYSROOT``)."""
    fs = fs if fs is not None else Sysfs()
    if not bus_present(fs):  # no CXL at all says so, before 'needs root'
        raise NotAvailableError(CxlTopology.NO_BUS)
    if not dry_run:
        require_root(fs, "creating a region")
    began = time.monotonic()
    attempt = 0
    while True:
        layout = layout_region(read_cxl(fs), request)
        name = region_plan.next_region_name(fs, layout)
        plan = region_plan.create_plan(
            fs, layout, name, online=request.online, zone=request.online_zone, mode=request.mode
        )
        if dry_run:
            return RegionResult(name, plan, executed=False, layout=layout)
        try:
            plan.execute(fs, before_step=before_step)
        except PlanFailed as e:
            if not _lost_race(e) or e.undo_errors:
                raise
            attempt += 1
            spent = time.monotonic() - began
            if spent >= RACE_WINDOW_S:
                raise StayedBusy(e, attempt, spent) from e
            (log.warning if attempt == 1 else log.info)(
                "%s; another region is being created: re-planning (for up to %.0f s)",
                e, RACE_WINDOW_S,
            )  # fmt: skip
            wait = min(RACE_BACKOFF_S * attempt, RACE_BACKOFF_MAX_S) * _jitter.uniform(0.5, 1.5)
            time.sleep(wait)
            continue
        return _result(fs, name, plan, layout=layout)


def destroy_region(
    region: Region | str,
    *,
    force: bool = False,
    fs: Sysfs | None = None,
    dry_run: bool = False,
    before_step: StepHook | None = None,
) -> RegionResult:
    """Offline, disable and tear down a region (one read from ``fs``, or as given, from
    a topology just read); pmem needs ``force``."""
    fs, region = _region(fs, region)
    name = region.name
    if region.type == PMEM and not force:
        raise InvalidRequestError(
            f"{name} is a pmem region: destroying it discards its data and labels; "
            "pass --force if that is intended"
        )
    later = regions_after(region)
    if later:
        raise InvalidRequestError(
            f"{name} is out of order: {', '.join(later)} decode{'s' if len(later) == 1 else ''} "
            f"after it on the same devices, and the kernel resets decoders newest first; "
            f"destroy {' and '.join(later)} first (as ndctl v85 asks)"
        )
    return _teardown(fs, region, delete=True, force=force, dry_run=dry_run, hook=before_step)


def regions_after(region: Region) -> list[str]:
    """Regions committed on a later decoder of one of ``region``'s endpoint ports: the
    kernel commits a port's decoders in id order and resets them in reverse, so those
    must be destroyed first."""
    topo = region._topo()
    later = set()
    for m in region.mappings:
        mine = topo.decoder(m.decoder)
        for d in mine.port_obj.decoders:
            if d.id > mine.id and d.region and d.region != region.name and d.committed:
                later.add(d.region)
    return sorted(later)


def disable_region(
    region: Region | str,
    *,
    force: bool = False,
    fs: Sysfs | None = None,
    dry_run: bool = False,
    before_step: StepHook | None = None,
) -> RegionResult:
    """Offline the region's memory and unbind its driver; the decode stays committed."""
    fs, region = _region(fs, region)
    return _teardown(fs, region, delete=False, force=force, dry_run=dry_run, hook=before_step)


def _check_zone_applies(name: str, zone: str, *, online: bool, volatile: bool,
                        devdax: bool) -> None:  # fmt: skip
    """A zone is asked for only where memory goes online: never silently dropped."""
    why = (
        None if volatile and online and not devdax
        else f"{name} is not volatile memory" if not volatile
        else "the memory stays offline" if not online
        else f"{name} is (or becomes) a devdax device, mapped by programs"
    )  # fmt: skip
    if why is not None:
        raise InvalidRequestError(
            f"zone {zone}: {why}, so its memory goes into no zone; leave the zone out "
            "(or enable it with mode system-ram, online)"
        )


def enable_region(
    region: Region | str,
    *,
    online: bool = True,
    zone: Zone | None = None,
    mode: str | None = None,
    fs: Sysfs | None = None,
    dry_run: bool = False,
    before_step: StepHook | None = None,
) -> RegionResult:
    """Bind a committed region's driver and online its memory (in ``zone``; default:
    normal); no-op parts are skipped. A region already online in the other zone is
    moved to ``zone`` when one is given: offlined, then onlined there, as one plan.
    ``mode`` switches its dax devices between system-ram and devdax (daxctl
    reconfigure-device), also as one plan."""
    fs, region = _region(fs, region)
    name = region.name
    if not region.committed:
        raise InvalidRequestError(
            f"{name} is not committed (decode reset); it has no memory to enable. "
            f"Destroy it (pycxl region destroy {name}) and create a new one"
        )
    if mode is not None:
        check_mode(mode)
    modes = {d.mode for d in region.dax_devices}
    volatile = region.type in VOLATILE_MODES  # its memory can go online
    if zone is not None:
        devdax = mode == "devdax" or (mode is None and "devdax" in modes)
        _check_zone_applies(name, zone, online=online, volatile=volatile, devdax=devdax)
    steps = [] if region.enabled else [region_plan.bind_step(name)]
    offline = any(d.online_memblocks < d.total_memblocks for d in region.dax_devices)
    current = {d.zone for d in region.dax_devices if d.zone is not None}
    if volatile and mode == "devdax" and (modes != {"devdax"} or not region.enabled):
        steps += region_plan.devdax_steps(name)
    elif volatile and mode == "system-ram" and "devdax" in modes:
        steps += region_plan.system_ram_steps(name, zone or "normal")
    elif volatile and "devdax" in modes and mode is None:
        pass  # a devdax region stays so unless a mode is asked for
    elif volatile and online and zone is not None and current - {zone}:
        steps += region_plan.rezone_steps(region, zone)
    elif volatile and online and (not region.enabled or offline):
        steps += region_plan.online_steps(fs, name, zone or "normal")
    plan = Plan(f"enable {name}", tuple(steps), action="enable")
    if dry_run:
        return RegionResult(name, plan, executed=False, region=region)
    if steps:
        require_root(fs, "enabling a region")
        plan.execute(fs, before_step=before_step)
    return _result(fs, name, plan)


def _region(fs: Sysfs | None, region: Region | str) -> tuple[Sysfs, Region]:
    """The tree and the region: a Region as given (read with its topology a moment
    ago: the one read), or a name read from the tree now."""
    fs = fs if fs is not None else Sysfs()
    if isinstance(region, Region):
        return fs, region
    return fs, read_cxl(fs).require().region(region)


def _teardown(
    fs: Sysfs, region: Region, *, delete: bool, force: bool, dry_run: bool, hook: StepHook | None
) -> RegionResult:
    warnings: list[str] = []
    plan = region_plan.teardown_plan(region, delete=delete, force=force, warnings=warnings)
    if dry_run:
        return RegionResult(region.name, plan, executed=False, region=region)
    if len(plan):
        require_root(fs, "destroying a region" if delete else "disabling a region")
        plan.execute(fs, before_step=hook)
    if delete:
        return RegionResult(region.name, plan, executed=True, warnings=tuple(warnings))
    return _result(fs, region.name, plan, warnings=warnings)


def _result(
    fs: Sysfs,
    name: str,
    plan: Plan,
    *,
    layout: RegionLayout | None = None,
    warnings: list[str] | None = None,
) -> RegionResult:
    topology = read_cxl(fs)
    region = topology.require().region(name)
    # The region's memory is a node's only once some of it is online.
    online = [d for d in region.dax_devices if d.online_memblocks]
    return RegionResult(
        name,
        plan,
        executed=True,
        region=region,
        layout=layout,
        numa_node=online[0].target_node if online else None,
        zone=combine_zones([d.zone for d in online]),
        warnings=tuple(warnings or ()),
        topology=topology,
    )


def _lost_race(e: PlanFailed) -> bool:
    busy = isinstance(e.cause, SysfsError) and e.cause.errno == errno.EBUSY
    path = e.step.path or ""
    return busy and (e.index == 0 or path.endswith("/commit") or _TARGET.search(path) is not None)
