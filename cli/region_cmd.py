"""pycxl region create|destroy|enable|disable (options as ndctl's cxl create-region and
destroy-region, disable-region, enable-region)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from pycxl.base.values import PARTITION_MODES

from .params import AS_JSON, COUNT, DRY_RUN, OBJECT_NAMES, SIZE, WRITES_SYSROOT, flatten
from .render import dash, emit_json, emit_table

if TYPE_CHECKING:
    from pycxl.base.plan import Step
    from pycxl.cxl.model import Region
    from pycxl.cxl.regions import RegionResult
    from pycxl.resolve.system import System

ZONE_HELP = (
    "Zone to online the memory into. normal: GPU-registered (long-term pinned) "
    "pages stay on the node; movable: the memory can always be offlined, but the "
    "kernel moves pinned pages off it."
)
ZONE = click.option("--zone", type=click.Choice(["normal", "movable"]), default=None,
                    help=ZONE_HELP + " (default: normal; only with --mode system-ram and "
                    "the memory online)")  # fmt: skip
REZONE = click.option("--zone", type=click.Choice(["normal", "movable"]), default=None,
                      help=ZONE_HELP + " A region online in the other zone is moved "
                      "(default: as it is; offline memory goes to normal).")  # fmt: skip
MODE_HELP = (
    "system-ram: the memory becomes a NUMA node; devdax: a device (/dev/daxX.Y) "
    "that programs map directly (pycxl.map_dax), whose pages long-term pins never "
    "move."
)
REGIONS = click.argument("regions", nargs=-1, required=True, metavar="REGION... | all",
                         type=OBJECT_NAMES)  # fmt: skip
ROOT_FILTER = click.option("-d", "--decoder", "root_decoder", default=None, metavar="DECODER",
                           help="Only regions of this root decoder (decoder0.0 or 0.0); a "
                                "region named outside it is an error.")  # fmt: skip


@click.group("region")
def region_group() -> None:
    """Create CXL regions and bring them online as NUMA nodes; tear them down."""


@region_group.command("create")
@click.argument("memdevs", nargs=-1, metavar="[MEMDEV]...", type=OBJECT_NAMES)
@click.option("-m", "--memdevs", "memdev_args", is_flag=True,
              help="The arguments are memdevs (as cxl create-region -m).")  # fmt: skip
@click.option("-w", "--ways", "--interleave", "ways", type=COUNT, default=None,
              help="Interleave ways (default: the number of memdevs named, else 1).")  # fmt: skip
@click.option("-g", "--granularity", type=SIZE, default=None,
              help="Interleave granularity in bytes (default: the root decoder's).")  # fmt: skip
@click.option("-s", "--size", type=SIZE, default=None,
              help="Region size, e.g. 512M (default: the largest that fits).")  # fmt: skip
@click.option("-t", "--type", "rtype", type=click.Choice(PARTITION_MODES), default=None,
              help="Region type (default: ram where the root decoder can map it).")  # fmt: skip
@click.option("-d", "--decoder", default=None, metavar="ROOT_DECODER",
              help="Root decoder (CXL window) to carve from (default: one that fits).")  # fmt: skip
@click.option("-b", "--bus", default=None, metavar="BUS",
              help="Only root decoders of this bus (root0, ACPI.CXL).")  # fmt: skip
@click.option("-U", "--uuid", default=None, help="UUID of a pmem region (default: random).")
@click.option("--no-online", is_flag=True, help="Stop once the region is committed and bound.")
@ZONE
@click.option("--mode", type=click.Choice(["system-ram", "devdax"]), default="system-ram",
              show_default=True, help=MODE_HELP)  # fmt: skip
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT  # fmt: skip
def create_command(
    memdevs: tuple[tuple[str, ...], ...], memdev_args: bool, ways: int | None,
    granularity: int | None, size: int | None, rtype: str | None, decoder: str | None,
    bus: str | None, uuid: str | None, no_online: bool, zone: str | None, mode: str,
    dry_run: bool, as_json: bool,
    sysroot: str | None,
) -> None:  # fmt: skip
    """Assemble memdevs into an interleaved region and online it as a NUMA node.

    MEMDEV is a memdev name (mem0), serial (0x1) or host PCI address, in any order:
    pycxl puts them in the interleave positions the topology requires. With no
    MEMDEV, memdevs with free capacity are picked.
    """
    from pycxl.byname.facade import create_region
    from pycxl.cxl.region_layout import RegionRequest
    from pycxl.resolve.system import snapshot

    req = RegionRequest(
        memdevs=flatten(memdevs, fold=False), ways=ways,  # positions: a repeat is refused
        granularity=granularity, size=size, type=rtype,  # type: ignore[arg-type]
        decoder=decoder, bus=bus, uuid=uuid, online=not no_online,
        zone=zone, mode=mode,  # type: ignore[arg-type]
    )  # fmt: skip
    system = snapshot(sysroot, gpus=False)  # the host, read once and passed down
    _emit([create_region(req, system=system, dry_run=dry_run)], as_json, single=True)


@region_group.command("destroy")
@REGIONS
@click.option("-f", "--force", is_flag=True,
              help="Required for pmem regions (their data is discarded). Memory that "
                   "cannot be offlined still stops a destroy.")  # fmt: skip
@ROOT_FILTER
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def destroy_command(regions: tuple[tuple[str, ...], ...], force: bool, root_decoder: str | None,
                    dry_run: bool, as_json: bool, sysroot: str | None) -> None:  # fmt: skip
    """Offline regions' memory, disable them and tear them down ('all': every region)."""
    from pycxl.byname.facade import destroy_region

    _each(regions, root_decoder, sysroot, as_json,
          lambda r, s: destroy_region(r, force=force, system=s, dry_run=dry_run),
          newest_first=True)  # fmt: skip


@region_group.command("disable")
@REGIONS
@click.option("-f", "--force", is_flag=True,
              help="Go on when memory cannot be offlined (leaks it until reboot).")  # fmt: skip
@ROOT_FILTER
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def disable_command(regions: tuple[tuple[str, ...], ...], force: bool, root_decoder: str | None,
                    dry_run: bool, as_json: bool, sysroot: str | None) -> None:  # fmt: skip
    """Offline regions' memory and unbind them; the decode stays committed."""
    from pycxl.byname.facade import disable_region

    _each(regions, root_decoder, sysroot, as_json,
          lambda r, s: disable_region(r, force=force, system=s, dry_run=dry_run))  # fmt: skip


@region_group.command("enable")
@REGIONS
@click.option("--no-online", is_flag=True, help="Bind only; leave the memory offline.")
@REZONE
@click.option("--mode", type=click.Choice(["system-ram", "devdax"]), default=None,
              help=MODE_HELP + " Switches a region that is in the other mode.")  # fmt: skip
@ROOT_FILTER
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def enable_command(regions: tuple[tuple[str, ...], ...], no_online: bool, zone: str | None,
                   mode: str | None, root_decoder: str | None, dry_run: bool, as_json: bool,
                   sysroot: str | None) -> None:  # fmt: skip
    """Bind committed regions and online their memory; with --zone, move memory that is
    online in the other zone there."""
    from pycxl.byname.facade import enable_region

    _each(regions, root_decoder, sysroot, as_json,
          lambda r, s: enable_region(r, online=not no_online, zone=zone, mode=mode,
                                     system=s, dry_run=dry_run))  # fmt: skip


def _each(names: tuple[tuple[str, ...], ...], root_decoder: str | None, sysroot: str | None,
          as_json: bool, op: Callable[[Region, System], RegionResult],
          newest_first: bool = False) -> None:  # fmt: skip
    """Run ``op`` on each named region (every region for 'all'), as ndctl does: all
    names are checked first; a region that fails does not stop the others; the exit
    status is the first failure's. ``newest_first``: 'all' in reverse (the kernel
    resets a port's decoders newest first). The host is read once, and its regions
    passed down as objects; after a region is changed, the next is read again (the
    change may concern it: a later decoder reset, a node gone)."""
    from pycxl.base.errors import PycxlError
    from pycxl.byname.listing import pick_regions
    from pycxl.resolve.system import snapshot

    system = snapshot(sysroot, gpus=False)
    targets = pick_regions(system.cxl.require(), flatten(names), root_decoder)
    if newest_first and "all" in flatten(names):
        targets = targets[::-1]
    results: list[RegionResult] = []
    failure: PycxlError | None = None
    for name in targets:
        try:
            if results and results[-1].executed and len(results[-1].plan):
                system = snapshot(system.sysfs(), gpus=False)
            results.append(op(system.cxl.region(name), system))
        except PycxlError as e:
            if len(targets) == 1:
                raise
            click.echo(f"pycxl: error: {name}: {e}", err=True)
            failure = failure or e
    if not targets and not as_json:
        click.echo("no regions")
    _emit(results, as_json)
    if failure is not None:
        raise _AlreadyReported(failure)


class _AlreadyReported(click.exceptions.Exit):
    """A failure already printed for its region: exit with its code, say nothing more."""

    def __init__(self, error: Exception) -> None:
        from pycxl.base.errors import PycxlError

        from .exit_codes import exit_code_for

        assert isinstance(error, PycxlError)
        super().__init__(exit_code_for(error))


# --- output --------------------------------------------------------------------------
def _emit(results: list[RegionResult], as_json: bool, *, single: bool = False) -> None:
    for r in results:
        for w in r.warnings:
            click.echo(f"pycxl: warning: {r.name}: {w}", err=True)
    if as_json:  # one shape per command: create's one object, a list from the others
        from pycxl.byname.to_json import region_result_json

        docs = [region_result_json(r) for r in results]
        emit_json(docs[0] if single else docs)
        return
    for r in results:
        _show(r)


def _show(r: RegionResult) -> None:
    from pycxl.base.units import format_size

    if not r.executed:
        click.echo(f"{r.plan.title} (dry run: nothing written)")
        if r.layout is not None:
            lay = r.layout
            click.echo(
                f"  {lay.type} region, {format_size(lay.size)}, {lay.ways}-way at "
                f"{lay.granularity} B, from {lay.root.name}; positions: "
                + ", ".join(f"{t.position}={t.memdev.name}" for t in lay.targets)
            )
        for line in r.plan.show() or ["   (nothing to do)"]:
            click.echo(line)
        return
    if r.region is None:
        click.echo(f"{r.name} destroyed ({_count(r.plan.steps)})")
        return
    reg = r.region
    rows = [[
        reg.name, reg.type, format_size(reg.size), reg.interleave_ways,
        reg.interleave_granularity, reg.decoder,
        " ".join(f"{m.position}:{m.memdev}" for m in reg.mappings),
        "enabled" if reg.enabled else "disabled", dash(r.numa_node), dash(r.tier),
        dash(r.zone),
    ]]  # fmt: skip
    emit_table(
        f"{r.plan.title} ({_count(r.plan.steps)})",
        ["region", "type", "size", "ways", "granularity", "root decoder", "positions",
         "state", "node", "tier", "zone"],
        rows,
    )  # fmt: skip
    if r.zone:
        click.echo(ZONE_MEANS[r.zone].format(tier=r.tier or f"node {r.numa_node}"))
    for d in reg.dax_devices:
        if d.mode == "devdax":
            click.echo(f"mode devdax: /dev/{d.name}, mapped directly (pycxl.map_dax); "
                       "long-term pins (GPU registration) never move its pages")  # fmt: skip


ZONE_MEANS = {
    "normal": "zone normal: long-term pins (GPU registration, RDMA) stay on {tier}",
    "movable": "zone movable: the kernel moves long-term-pinned pages (GPU registration, "
    "RDMA) off {tier} to DRAM; for GPU memory on {tier}, use --zone normal or device-dax",
    "mixed": "zones mixed: long-term pins stay only in the normal part of {tier}",
}


def _count(steps: tuple[Step, ...]) -> str:
    return f"{len(steps)} step{'s' if len(steps) != 1 else ''}"
