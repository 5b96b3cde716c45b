"""pycxl numa, pycxl run, pycxl where: NUMA nodes by tier, policies for commands, and
where a process's memory is."""

from __future__ import annotations

import sys

import click

from pycxl.numa.launch import LaunchRequest, run
from pycxl.numa.pages import process_usage
from pycxl.system import snapshot
from pycxl.units import format_size

from .render import dash, emit_json, emit_table

SYSROOT = click.option("--sysroot", envvar="PYCXL_SYSROOT", default=None, metavar="DIR",
                       hidden=True)  # fmt: skip


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(v for value in values for v in value.split(",") if v)


@click.command("numa")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@SYSROOT
def numa_command(as_json: bool, sysroot: str | None) -> None:
    """NUMA nodes with tier names, CPUs, memory and distances (numactl -H, by tier)."""
    s = snapshot(sysroot, gpus=False)
    if as_json:
        emit_json([
            {"node": t.node.id, "name": t.name, "tier": t.tier, "cpus": list(t.node.cpus),
             "mem_total": t.node.mem_total, "mem_free": t.node.mem_free, "region": t.region,
             "distances": {str(k): v for k, v in t.node.distances.items()}}
            for t in s.nodes
        ])  # fmt: skip
        return
    rows = [[t.node.id, t.name, t.tier, _cpus(t.node.cpus), format_size(t.node.mem_total),
             format_size(t.node.mem_free), dash(t.region)] for t in s.nodes]  # fmt: skip
    emit_table("NUMA nodes", ["node", "name", "tier", "cpus", "total", "free", "region"], rows)
    ids = [t.node.id for t in s.nodes]
    matrix = [[t.name] + [dash(t.node.distances.get(j)) for j in ids] for t in s.nodes]
    emit_table("Distances", ["", *(t.name for t in s.nodes)], matrix)


def _cpus(cpus: tuple[int, ...]) -> str:
    if not cpus:
        return "-"
    out, start, prev = [], cpus[0], cpus[0]
    for c in (*cpus[1:], None):
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(f"{start}-{prev}" if prev != start else str(start))
        if c is not None:
            start = prev = c
    return ",".join(out)


@click.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--membind", "-m", multiple=True, metavar="T[,T]", help="Allocate only on these.")
@click.option("--preferred", "-p", default=None, metavar="T", help="Allocate here first.")
@click.option("--interleave", "-i", multiple=True, metavar="T,T", help="Round robin over these.")
@click.option("--weights", "-w", default=None, metavar="A,B",
              help="Weighted interleave: one weight per --interleave node (Linux 6.9+; "
                   "sets the system-wide weights while the command runs).")  # fmt: skip
@click.option("--cpunodebind", "-N", multiple=True, metavar="T[,T]",
              help="Run on the CPUs of these nodes (dram0, node0, cpu3...).")  # fmt: skip
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@SYSROOT
def run_command(
    membind: tuple[str, ...], preferred: str | None, interleave: tuple[str, ...],
    weights: str | None, cpunodebind: tuple[str, ...], command: tuple[str, ...],
    sysroot: str | None,
) -> None:  # fmt: skip
    """Run COMMAND under a memory policy named by tiers; exits with its status.

    pycxl run --membind cxl0 -- python3 train.py
    pycxl run --interleave dram0,cxl0 --weights 3,1 -- ./app
    """
    try:
        w = tuple(int(x) for x in weights.split(",")) if weights else ()
    except ValueError:
        raise click.BadParameter(f"'{weights}': expected integers such as 3,1") from None
    req = LaunchRequest(
        command=command, membind=_split(membind), preferred=preferred,
        interleave=_split(interleave), weights=w, cpunodebind=_split(cpunodebind),
    )  # fmt: skip
    sys.stdout.flush()
    raise click.exceptions.Exit(run(req, sysroot))


@click.command("where")
@click.argument("pid", type=int)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@SYSROOT
def where_command(pid: int, as_json: bool, sysroot: str | None) -> None:
    """Resident memory of process PID per NUMA node and tier (from its numa_maps)."""
    usage = process_usage(pid)
    names = {t.node.id: t for t in snapshot(sysroot, gpus=False).nodes}
    if as_json:
        emit_json([{"node": n, "name": names[n].name if n in names else None,
                    "tier": names[n].tier if n in names else None, "bytes": b}
                   for n, b in usage.items()])  # fmt: skip
        return
    total = sum(usage.values()) or 1
    rows = [[n, names[n].name if n in names else "-", names[n].tier if n in names else "-",
             format_size(b), f"{100 * b / total:.1f}%"] for n, b in usage.items()]  # fmt: skip
    emit_table(f"process {pid}", ["node", "name", "tier", "resident", "share"], rows)
