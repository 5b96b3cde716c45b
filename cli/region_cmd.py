"""pycxl region create|destroy|enable|disable."""

from __future__ import annotations

from typing import Any

import click

from pycxl.cxl.memory_blocks import Zone
from pycxl.cxl.ndctl_json import region_json
from pycxl.cxl.region_layout import RegionRequest
from pycxl.cxl.regions import (
    RegionResult,
    create_region,
    destroy_region,
    disable_region,
    enable_region,
)
from pycxl.plan import Step
from pycxl.units import format_size, parse_size

from .render import dash, emit_json, emit_table

SYSROOT = click.option("--sysroot", envvar="PYCXL_SYSROOT", default=None, metavar="DIR",
                       hidden=True)  # fmt: skip
DRY_RUN = click.option(
    "--dry-run", is_flag=True, help="Show the plan (sysfs writes); change nothing."
)
AS_JSON = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
ZONE = click.option("--zone", type=click.Choice(["movable", "normal"]), default="movable",
                    show_default=True,
                    help="Zone to online the memory into (movable: can be offlined).")  # fmt: skip


@click.group("region")
def region_group() -> None:
    """Create CXL regions and bring them online as NUMA nodes; tear them down."""


@region_group.command("create")
@click.argument("memdevs", nargs=-1, metavar="[MEMDEV]...")
@click.option(
    "-w",
    "--interleave",
    "--ways",
    "ways",
    type=int,
    default=None,
    help="Interleave ways (default: the number of memdevs named, else 1).",
)
@click.option(
    "-g",
    "--granularity",
    default=None,
    metavar="BYTES",
    help="Interleave granularity (default: the root decoder's).",
)
@click.option(
    "-s",
    "--size",
    default=None,
    metavar="SIZE",
    help="Region size, e.g. 512M (default: the largest that fits).",
)
@click.option(
    "-t",
    "--type",
    "rtype",
    type=click.Choice(["ram", "pmem"]),
    default=None,
    help="Region type (default: ram where the root decoder can map it).",
)
@click.option(
    "-d",
    "--decoder",
    default=None,
    metavar="ROOT_DECODER",
    help="Root decoder (CXL window) to carve from (default: one that fits).",
)
@click.option("-U", "--uuid", default=None, help="UUID of a pmem region (default: random).")
@click.option("--no-online", is_flag=True, help="Stop once the region is committed and bound.")
@ZONE
@DRY_RUN
@AS_JSON
@SYSROOT  # fmt: skip
def create_command(
    memdevs: tuple[str, ...], ways: int | None, granularity: str | None, size: str | None,
    rtype: str | None, decoder: str | None, uuid: str | None, no_online: bool, zone: str,
    dry_run: bool, as_json: bool, sysroot: str | None,
) -> None:  # fmt: skip
    """Assemble memdevs into an interleaved region and online it as a NUMA node.

    MEMDEV is a memdev name (mem0), serial (0x1) or host PCI address, in any order:
    pycxl puts them in the interleave positions the topology requires. With no
    MEMDEV, memdevs with free capacity are picked.
    """
    req = RegionRequest(
        memdevs=memdevs, ways=ways,
        granularity=parse_size(granularity) if granularity else None,
        size=parse_size(size) if size else None,
        type=rtype,  # type: ignore[arg-type]
        decoder=decoder, uuid=uuid, online=not no_online,
        zone=_zone(zone),
    )  # fmt: skip
    _emit(create_region(req, sysroot=sysroot, dry_run=dry_run), as_json)


@region_group.command("destroy")
@click.argument("region")
@click.option("-f", "--force", is_flag=True,
              help="Go on when memory cannot be offlined (leaks it until reboot); "
                   "required for pmem regions.")  # fmt: skip
@DRY_RUN
@AS_JSON
@SYSROOT
def destroy_command(
    region: str, force: bool, dry_run: bool, as_json: bool, sysroot: str | None
) -> None:
    """Offline a region's memory, disable it and tear it down."""
    _emit(destroy_region(region, force=force, sysroot=sysroot, dry_run=dry_run), as_json)


@region_group.command("disable")
@click.argument("region")
@click.option("-f", "--force", is_flag=True,
              help="Go on when memory cannot be offlined (leaks it until reboot).")  # fmt: skip
@DRY_RUN
@AS_JSON
@SYSROOT
def disable_command(
    region: str, force: bool, dry_run: bool, as_json: bool, sysroot: str | None
) -> None:
    """Offline a region's memory and unbind it; the decode stays committed."""
    _emit(disable_region(region, force=force, sysroot=sysroot, dry_run=dry_run), as_json)


@region_group.command("enable")
@click.argument("region")
@click.option("--no-online", is_flag=True, help="Bind only; leave the memory offline.")
@ZONE
@DRY_RUN
@AS_JSON
@SYSROOT
def enable_command(
    region: str, no_online: bool, zone: str, dry_run: bool, as_json: bool, sysroot: str | None
) -> None:
    """Bind a committed region and online its memory."""
    result = enable_region(
        region, online=not no_online, zone=_zone(zone), sysroot=sysroot, dry_run=dry_run
    )
    _emit(result, as_json)


def _zone(choice: str) -> Zone:
    return "normal" if choice == "normal" else "movable"


# --- output --------------------------------------------------------------------------
def result_json(r: RegionResult) -> dict[str, Any]:
    doc: dict[str, Any] = {"region": r.name, "action": r.plan.title.split()[0]}
    if not r.executed:
        doc["dry_run"] = True
        doc["plan"] = r.plan.as_json()
    if r.layout is not None:
        lay = r.layout
        doc["layout"] = {
            "decoder": lay.root.name, "type": lay.type, "size": lay.size,
            "interleave_ways": lay.ways, "interleave_granularity": lay.granularity,
            "targets": [{"position": t.position, "memdev": t.memdev.name,
                         "decoder": t.decoder.name} for t in lay.targets],
        }  # fmt: skip
    if r.executed and r.region is not None:
        doc.update(region_json(r.region, targets=True))
        doc["numa_node"] = r.numa_node
        doc["tier"] = r.tier
    if r.warnings:
        doc["warnings"] = list(r.warnings)
    return doc


def _emit(r: RegionResult, as_json: bool) -> None:
    for w in r.warnings:
        click.echo(f"pycxl: warning: {w}", err=True)
    if as_json:
        emit_json(result_json(r))
        return
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
    ]]  # fmt: skip
    emit_table(
        f"{r.plan.title} ({_count(r.plan.steps)})",
        ["region", "type", "size", "ways", "granularity", "root decoder", "positions",
         "state", "node", "tier"],
        rows,
    )  # fmt: skip


def _count(steps: tuple[Step, ...]) -> str:
    return f"{len(steps)} step{'s' if len(steps) != 1 else ''}"
