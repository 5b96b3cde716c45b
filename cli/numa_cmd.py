"""pycxl numa, pycxl run, pycxl where: NUMA nodes by tier, commands under a memory policy
(options as numactl's), and where a process's memory is."""

from __future__ import annotations

import sys
from typing import Any

import click

from .params import CPUS, NODES, PAGE_SIZE, WEIGHTS, PidType, flatten, sysroot_option
from .render import advertised, dash, emit_json, emit_table, near, pins, ranges

SYSROOT = sysroot_option(
    "Read a recorded sysfs tree instead of this machine (--set-weights "
    "then writes the tree's files; nothing is measured on a tree)"
)


@click.command("numa")
@click.option("--set-weights", "set_weights", default=None, type=WEIGHTS,
              metavar="NODE=W[,NODE=W]|auto",
              help="Set the system-wide weighted-interleave weights (root; they stay until "
                   "changed, as writing sysfs does), then show the nodes. 'auto': give them "
                   "back to the kernel (Linux 6.16+).")  # fmt: skip
@click.option("--tune-weights", "tune", default=None, type=NODES,
              help="Measure the bandwidth of these nodes (all: the tiers of the --from "
                   "socket) from one socket's CPUs and set weights in proportion.")  # fmt: skip
@click.option("--from", "initiator", default=None, metavar="NODE",
              help="With --tune-weights: the socket whose CPUs measure (default: the one "
                   "nearest the first node).")  # fmt: skip
@click.option("--dry-run", is_flag=True,
              help="Show the weight changes (and the measurements); set nothing.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@SYSROOT
def numa_command(set_weights: str | None, tune: tuple[str, ...] | None, initiator: str | None,
                 dry_run: bool, as_json: bool, sysroot: str | None) -> None:  # fmt: skip
    """NUMA nodes with tier names, CPUs, memory, distances, weighted-interleave weights,
    each node's nearest socket and what the platform advertises for it (numactl -H, by
    tier)."""
    from pycxl.base.units import format_size
    from pycxl.byname.to_json import node_json
    from pycxl.numa.policy import read_weight_mode, read_weights
    from pycxl.resolve.system import snapshot

    if set_weights is not None and tune is not None:
        raise click.UsageError("choose one of --set-weights and --tune-weights")
    if initiator is not None and tune is None:
        raise click.UsageError("--from goes with --tune-weights")
    s = snapshot(sysroot, gpus=False)
    fs = s.sysfs()  # the tree the snapshot read, opened once
    if tune is not None:
        _tune(s, fs, tune, initiator, dry_run, as_json)
        return
    if set_weights is not None:
        plan = _weights_plan(set_weights, s, fs)
        if dry_run:
            _show_plan(plan, as_json)
            return
        auto_was = read_weight_mode(fs) == "auto"
        plan.execute(fs)
        if auto_was and read_weight_mode(fs) == "manual" and not as_json:
            click.echo("pycxl: the kernel's auto weights were turned off (pycxl numa "
                       "--set-weights auto turns them back on)", err=True)  # fmt: skip
    elif dry_run:
        raise click.UsageError("--dry-run goes with --set-weights or --tune-weights")
    weights = _try_weights(read_weights, fs)
    mode = read_weight_mode(fs)
    if as_json:
        emit_json([{**node_json(t), "weight": weights.get(t.node.id), "weight_mode": mode}
                   for t in s.nodes])  # fmt: skip
        return
    rows = [[t.node.id, t.name, t.tier, ranges(t.node.cpus), format_size(t.node.mem_total),
             format_size(t.node.mem_free), dash(t.region), dash(t.zone),
             pins(t.holds_longterm_pins, t.zone), dash(weights.get(t.node.id)), near(s, t),
             advertised(t.node.advertised)]
            for t in s.nodes]  # fmt: skip
    headers = ["node", "name", "tier", "cpus", "total", "free", "region", "zone", "pins", "weight",
               "near", "advertised"]  # fmt: skip
    emit_table("NUMA nodes", headers, rows)
    if mode is not None:
        click.echo(f"weights: {WEIGHT_MODES[mode]}\n")
    ids = [t.node.id for t in s.nodes]
    matrix = [[t.name] + [dash(t.node.distances.get(j)) for j in ids] for t in s.nodes]
    emit_table("Distances", ["", *(t.name for t in s.nodes)], matrix)


WEIGHT_MODES = {
    "auto": "auto (the kernel derives them from the platform's bandwidth figures)",
    "manual": "manual (set by hand, or by pycxl numa --set-weights/--tune-weights)",
}


def _weights_plan(text: str, s: object, fs: object) -> Any:
    from pycxl.numa.policy import auto_weights_plan, weights_plan

    if text == "auto":
        return auto_weights_plan(fs)  # type: ignore[arg-type]
    return weights_plan(_weights(text, s), fs)  # type: ignore[arg-type]


def _show_plan(plan: Any, as_json: bool) -> None:
    if as_json:
        from pycxl.byname.to_json import plan_json

        emit_json({"plan": plan_json(plan)})
        return
    click.echo(f"{plan.title}: {len(plan)} step(s), dry run" if len(plan) else
               f"{plan.title}: nothing to change")  # fmt: skip
    for line in plan.show():
        click.echo(line)


def _tune(s: Any, fs: Any, nodes: tuple[str, ...], initiator: str | None, dry_run: bool,
          as_json: bool) -> None:  # fmt: skip
    from pycxl.base.units import format_size
    from pycxl.byname.tuning import apply_weights, plan_weights

    everything = list(nodes) == ["all"]
    tuning = plan_weights(None if everything else list(nodes), initiator, system=s, fs=fs)
    if not dry_run:
        apply_weights(tuning, fs)
    if as_json:
        from pycxl.byname.to_json import tuning_json

        emit_json({**tuning_json(tuning), "dry_run": dry_run})
        return
    total = sum(t.bytes_per_s for t in tuning.measured) or 1.0
    rows = [[t.name, t.node, f"{format_size(int(t.bytes_per_s))}/s",
             f"{100 * t.bytes_per_s / total:.1f}%",
             dash(tuning.previous.get(t.node)), tuning.weights[t.node]]
            for t in tuning.measured]  # fmt: skip
    emit_table(f"Weighted interleave from {tuning.initiator}'s CPUs ({ranges(tuning.cpus)}), "
               f"STREAM triad", ["tier", "node", "measured", "share", "weight was", "weight"],
               rows)  # fmt: skip
    click.echo(f"rule: {tuning.rule}")
    if tuning.turns_auto_off:
        click.echo("the kernel's auto weights were on: " + (
            "setting these turns them off" if dry_run else
            "turned off (pycxl numa --set-weights auto turns them back on)"))  # fmt: skip
    if dry_run:
        for line in tuning.plan.show():
            click.echo(line)
        click.echo("dry run: nothing was set")
    else:
        click.echo(f"set; undo: pycxl numa --set-weights {tuning.names(tuning.previous)}")


def _try_weights(read: object, fs: object) -> dict[int, int]:
    from pycxl.base.errors import NotAvailableError

    try:
        return read(fs)  # type: ignore[operator, no-any-return]
    except NotAvailableError:
        return {}  # a kernel without weighted interleave: the column stays empty


def _weights(text: str, s: object) -> dict[int, int]:
    from pycxl.resolve.system import System

    assert isinstance(s, System)
    out: dict[int, int] = {}
    given: dict[int, str] = {}  # node -> the item that weighed it
    for item in (i.strip() for i in text.split(",")):  # their shape checked by WEIGHTS
        name, _, value = item.partition("=")
        for node in s.memory_nodes(name.strip()):
            if node in given:
                raise click.BadParameter(
                    f"node {node} is given two weights ({given[node]} and {item}); give each "
                    "node once", param_hint="--set-weights",
                )  # fmt: skip
            given[node] = item
            out[node] = int(value)
    return out


@click.command("run", context_settings={"allow_interspersed_args": False})
@click.option("-m", "--membind", multiple=True, type=NODES,
              help="Allocate only on these nodes.")  # fmt: skip
@click.option("-p", "--preferred", default=None, metavar="NODE",
              help="Allocate on this node first.")  # fmt: skip
@click.option("-P", "--preferred-many", "preferred_many", multiple=True, type=NODES,
              help="Allocate on these nodes first (Linux 5.15+).")  # fmt: skip
@click.option("-i", "--interleave", multiple=True, type=NODES,
              help="Interleave pages over these nodes, round robin.")  # fmt: skip
@click.option("-w", "--weighted-interleave", "weighted", multiple=True, type=NODES,
              help="Interleave by the system-wide weights (Linux 6.9+; pycxl numa "
                   "--set-weights sets them).")  # fmt: skip
@click.option("-l", "--localalloc", is_flag=True, help="Allocate on the CPU's own node.")
@click.option("-N", "--cpunodebind", multiple=True, type=NODES,
              help="Run on the CPUs of these nodes.")  # fmt: skip
@click.option("-C", "--physcpubind", multiple=True, type=CPUS,
              help="Run on these CPUs (0-3,8 or all).")  # fmt: skip
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_command(
    membind: tuple[tuple[str, ...], ...], preferred: str | None,
    preferred_many: tuple[tuple[str, ...], ...], interleave: tuple[tuple[str, ...], ...],
    weighted: tuple[tuple[str, ...], ...], localalloc: bool,
    cpunodebind: tuple[tuple[str, ...], ...], physcpubind: tuple[tuple[str, ...], ...],
    command: tuple[str, ...],
) -> None:  # fmt: skip
    """Run COMMAND under a memory policy and CPU binding named by tiers, as numactl
    does: the policy is set on this process, which then becomes COMMAND (same PID;
    signals go straight to it; the exit status is its own). NODES: names (dram0, cxl0,
    node1), ids, ranges (0-2), or all.

    \b
    pycxl run --membind cxl0 -- python3 train.py
    pycxl run -w dram0,cxl0 -- ./app
    """
    from pycxl.numa.launch import exec_command, find_command
    from pycxl.resolve.system import snapshot

    find_command(command)  # a typo is an error before anything is set
    system = snapshot(gpus=False)
    system.require_live(f"running {command[0]}")  # a tree's names would bind this machine's
    settings = system.launch_settings(
        membind=flatten(membind), preferred=preferred, preferred_many=flatten(preferred_many),
        interleave=flatten(interleave), weighted_interleave=flatten(weighted),
        localalloc=localalloc, cpunodebind=flatten(cpunodebind),
        physcpubind=flatten(physcpubind),
    )  # fmt: skip
    for stream in (sys.stdout, sys.stderr):  # None where closed: the command meets that
        if stream is not None:
            stream.flush()
    exec_command(settings, command)


@click.command("where")
@click.argument("pid", type=PidType())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def where_command(pid: int, as_json: bool) -> None:
    """Resident memory of process PID per NUMA node and tier (from its numa_maps)."""
    from pycxl.base.units import format_size
    from pycxl.numa.pages import process_usage
    from pycxl.resolve.system import snapshot

    s = snapshot(gpus=False)
    s.require_live(f"where {pid}")  # a process of this machine, by its nodes' names
    usage = process_usage(pid)
    if as_json:
        emit_json([{"node": n, "name": s.tier_name(n),
                    "tier": t.tier if (t := s.tier(n)) else None, "bytes": b}
                   for n, b in usage.items()])  # fmt: skip
        return
    total = sum(usage.values()) or 1
    rows = [[n, dash(s.tier_name(n)), dash(t.tier if (t := s.tier(n)) else None),
             format_size(b), f"{100 * b / total:.1f}%"] for n, b in usage.items()]  # fmt: skip
    emit_table(f"process {pid}", ["node", "name", "tier", "resident", "share"], rows)


@click.command("pin-probe")
@click.argument("targets", nargs=-1, metavar="[TARGET]...")
@click.option("--size", type=PAGE_SIZE, default="2M", show_default=True,
              help="Memory pinned on each tier.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def pin_probe_command(targets: tuple[str, ...], size: int, as_json: bool) -> None:
    """Whether each tier keeps long-term-pinned memory (what GPU registration and RDMA
    take), by trying: SIZE bytes are placed there, pinned as io_uring fixed buffers,
    and counted page by page. Default: every node with memory. Nothing stays pinned."""
    from pycxl.byname.facade import probe_longterm_pins

    probes = probe_longterm_pins(list(targets) or None, size=size)
    if as_json:
        from pycxl.byname.to_json import pin_probe_json

        emit_json([pin_probe_json(p) for p in probes])
        return
    rows = [[p.tier, p.node, dash(p.zone), p.placement.pages, p.placement.on_expected,
             dash(", ".join(f"node{n}: {c}" for n, c in p.placement.moved_to.items())),
             "yes" if p.holds else "no"] for p in probes]  # fmt: skip
    emit_table("Long-term pins", ["tier", "node", "zone", "pages", "stayed", "moved",
                                  "holds pins"], rows)  # fmt: skip
