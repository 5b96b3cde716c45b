"""What the device commands (memdev, port, bus) share: running one operation per object
as ndctl does, and showing results as lines or ndctl's JSON (their options are
cli.params')."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from .render import emit_json

if TYPE_CHECKING:
    from pycxl.cxl.device_ops import DeviceResult


def each_object(names: list[str], op: Callable[[str], DeviceResult], as_json: bool,
                key: str) -> None:  # fmt: skip
    """Run ``op`` on each object, as ndctl does: one that fails does not stop the others;
    the exit status is the first failure's."""
    from pycxl.base.errors import PycxlError

    from .exit_codes import exit_code_for

    results: list[DeviceResult] = []
    failure: PycxlError | None = None
    for name in names:
        try:
            results.append(op(name))
        except PycxlError as e:
            if len(names) == 1:
                raise
            click.echo(f"pycxl: error: {name}: {e}", err=True)
            failure = failure or e
    emit_results(results, as_json, key)
    if failure is not None:
        raise click.exceptions.Exit(exit_code_for(failure))


def result_json(r: DeviceResult, key: str) -> dict[str, Any]:
    """ndctl's JSON of the object operated on (the memdev, with the decoder, partition,
    firmware or alert configuration the operation touched), plus the plan in a dry run."""
    from pycxl.byname.to_json import alert_config_json, decoder_json, memdev_json, plan_json

    doc: dict[str, Any] = memdev_json(r.memdev) if r.memdev is not None else {"name": r.target}
    d = r.details
    if key == "decoder" and "decoder" in d:
        doc["decoder"] = decoder_json(d["decoder"])
    elif key == "partition" and "partitioning" in d:
        p = d["partitioning"]
        doc["partition_info"] = {
            "total_size": p.total, "volatile_only_size": p.volatile_only,
            "persistent_only_size": p.persistent_only,
            "partition_alignment_size": p.alignment,
            "requested_volatile_size": d["volatile_size"],
        }  # fmt: skip
    elif key == "firmware" and "firmware" in d:
        doc["firmware"] = _firmware_json(d)
    elif key == "alert_config" and "alert_config" in d:
        doc["alert_config"] = alert_config_json(d["alert_config"])
    elif key == "poison":
        doc["address"] = d.get("address")
        doc["region"] = d.get("region")
    elif key in ("sanitize", "port", "bus"):
        doc.update({k: v for k, v in d.items() if isinstance(v, str | int | float | list)})
    doc["action"] = r.plan.title.split()[0]
    if not r.executed:
        doc["dry_run"] = True
        doc["plan"] = plan_json(r.plan)
    if r.warnings:
        doc["warnings"] = list(r.warnings)
    return doc


def _firmware_json(d: dict[str, Any]) -> dict[str, Any]:
    """ndctl's firmware object: slots, active and staged slot, revisions, loader state."""
    from pycxl.byname.to_json import firmware_info_json

    info, loader = d["firmware"], d["loader"]
    doc: dict[str, Any] = firmware_info_json(info)
    doc["fw_update_in_progress"] = loader.busy
    doc["remaining_size"] = loader.remaining
    if loader.error:
        doc["error"] = loader.error
    return doc


def emit_results(results: list[DeviceResult], as_json: bool, key: str) -> None:
    """Warnings to stderr; then the results as JSON (a list) or one block each."""
    for r in results:
        for w in r.warnings:
            click.echo(f"pycxl: warning: {r.target}: {w}", err=True)
    if as_json:
        emit_json([result_json(r, key) for r in results])
        return
    for r in results:
        if not r.executed:
            click.echo(f"{r.plan.title} (dry run: nothing written)")
            for line in r.plan.show() or ["   (nothing to do)"]:
                click.echo(line)
            continue
        n = len(r.plan)
        said = f"{n} step{'s' if n != 1 else ''}" if n else "nothing to do"
        click.echo(f"{r.plan.title}: done ({said}){_summary(r, key)}")


def _summary(r: DeviceResult, key: str) -> str:
    """The one fact a person checks after the operation."""
    d = r.details
    if key == "memdev" and r.memdev is not None and "size" not in d:
        return f"; {r.memdev.name} is {'enabled' if r.memdev.enabled else 'disabled'}"
    if key == "decoder" and "decoder" in d:
        dec = d["decoder"]
        return f"; {dec.name}: mode {dec.mode}, dpa_size {(dec.dpa_size or 0) >> 20} MiB"
    if key == "firmware" and "firmware" in d:
        info = d["firmware"]
        active = info.revisions[info.active_slot - 1] if info.active_slot else "?"
        return f"; active slot {info.active_slot} ({active}), loader {d['loader'].status}"
    if key == "alert_config" and "alert_config" in d:
        return "; alert thresholds read back: pycxl list -A -m " + r.target
    if key == "sanitize" and "state" in d:
        return f"; security state {d['state']}"
    if key in ("port", "bus") and d.get("memdevs"):
        return f"; memdevs below: {', '.join(d['memdevs'])}"
    return ""
