"""pycxl list: CXL objects, NUMA nodes with tiers, GPUs."""

from __future__ import annotations

import click

from pycxl.listing import ListRequest, Selection, list_json, select
from pycxl.system import System, snapshot
from pycxl.units import format_size

from .render import dash, emit_json, emit_table


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(v for value in values for v in value.replace(",", " ").split() if v)


@click.command("list")
@click.option("-M", "--memdevs", is_flag=True, help="CXL memory devices.")
@click.option("-D", "--decoders", is_flag=True, help="HDM decoders (root, switch, endpoint).")
@click.option("-R", "--regions", is_flag=True, help="CXL regions.")
@click.option("-B", "--buses", is_flag=True, help="CXL buses (platform roots).")
@click.option("-P", "--ports", is_flag=True, help="Switch and host-bridge ports.")
@click.option("-E", "--endpoints", is_flag=True, help="Endpoint ports.")
@click.option("-T", "--targets", is_flag=True, help="Decoder targets, dports, region mappings.")
@click.option("-X", "--dax", is_flag=True, help="Dax devices fed by CXL regions.")
@click.option("-N", "--numa", is_flag=True, help="NUMA nodes with their tier names.")
@click.option("-G", "--gpus", is_flag=True, help="GPUs with their nearest NUMA node.")
@click.option("-i", "--include-disabled", is_flag=True, help="Also disabled objects.")
@click.option("-u", "--human", is_flag=True, help="Human sizes and hex addresses in JSON.")
@click.option("-m", "--memdev", "memdev_filter", multiple=True, metavar="NAME|SERIAL|HOST")
@click.option("-d", "--decoder", "decoder_filter", multiple=True,
              metavar="NAME|root|switch|endpoint|all")  # fmt: skip
@click.option("-r", "--region", "region_filter", multiple=True, metavar="NAME")
@click.option("-b", "--bus", "bus_filter", multiple=True, metavar="NAME|PROVIDER")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (ndctl fields).")
@click.option("--backend", type=click.Choice(["sysfs", "libcxl"]), default="sysfs",
              show_default=True, help="Where CXL objects are read from.")  # fmt: skip
@click.option("--sysroot", envvar="PYCXL_SYSROOT", default=None, metavar="DIR",
              help="Read a recorded sysfs tree instead of the live one.")  # fmt: skip
def list_command(
    memdevs: bool, decoders: bool, regions: bool, buses: bool, ports: bool, endpoints: bool,
    targets: bool, dax: bool, numa: bool, gpus: bool, include_disabled: bool, human: bool,
    memdev_filter: tuple[str, ...], decoder_filter: tuple[str, ...],
    region_filter: tuple[str, ...], bus_filter: tuple[str, ...], as_json: bool,
    backend: str, sysroot: str | None,
) -> None:  # fmt: skip
    """List memory tiers: CXL objects, NUMA nodes, GPUs.

    With no object flag, a summary: memdevs, regions, NUMA nodes with tier names,
    GPUs with their nearest node, and what is absent.
    """
    req = ListRequest(
        memdevs=memdevs, decoders=decoders, regions=regions, buses=buses, ports=ports,
        endpoints=endpoints, targets=targets, dax=dax, numa=numa, gpus=gpus,
        include_disabled=include_disabled, human=human,
        memdev_filter=_split(memdev_filter), decoder_filter=_split(decoder_filter),
        region_filter=_split(region_filter), bus_filter=_split(bus_filter),
    )  # fmt: skip
    # The CUDA driver takes a while to start: ask it only when GPUs are shown.
    want_gpus = req.summary or req.gpus
    system = snapshot(sysroot, backend=backend, gpus=want_gpus)  # type: ignore[arg-type]
    if as_json:
        emit_json(list_json(system, req))
        return
    sel = select(system, req)
    if req.summary:
        _summary(system, sel)
        return
    if buses:
        emit_table("Buses", ["bus", "provider"], [[b.name, b.provider] for b in sel.buses])
    if ports or endpoints:
        rows = [
            [p.name, p.kind, p.host, p.depth, dash(p.parent),
             ", ".join(f"{d.name}#{d.id}" for d in p.dports) if targets else len(p.dports)]
            for p in (sel.ports if ports else []) + (sel.endpoints if endpoints else [])
        ]  # fmt: skip
        emit_table("Ports", ["port", "kind", "host", "depth", "parent", "dports"], rows)
    if memdevs:
        _memdevs(sel)
    if decoders:
        _decoders(sel, targets)
    if regions:
        _regions(system, sel, targets)
    if dax:
        emit_table(
            "Dax devices",
            ["dax", "region", "size", "mode", "node", "online blocks", "movable"],
            [[d.name, dash(d.region), format_size(d.size), d.mode, dash(d.target_node),
              f"{d.online_memblocks}/{d.total_memblocks}", dash(d.movable)] for d in sel.dax],
        )  # fmt: skip
    if numa:
        _nodes(sel)
    if gpus:
        _gpus(system, sel)


def _memdevs(sel: Selection) -> None:
    emit_table(
        "CXL memdevs",
        ["memdev", "serial", "host", "ram", "pmem", "numa", "endpoint", "regions"],
        [[m.name, dash(None if m.serial is None else hex(m.serial)), m.host,
          format_size(m.ram_size) if m.ram_size else "-",
          format_size(m.pmem_size) if m.pmem_size else "-", dash(m.numa_node),
          dash(m.endpoint.name if m.endpoint else None),
          dash(", ".join(r.name for r in m.regions))] for m in sel.memdevs],
    )  # fmt: skip


def _decoders(sel: Selection, targets: bool) -> None:
    rows = []
    for d in sel.decoders:
        if d.kind == "endpoint":
            route = f"{d.mode or '-'} dpa {format_size(d.dpa_size)}" if d.dpa_size else dash(d.mode)
        elif targets:
            route = ", ".join(t.name for t in d.targets)
        else:
            route = ",".join(map(str, d.target_list))
        rows.append([
            d.name, d.kind, d.port,
            dash(None if d.resource is None or not d.size else hex(d.resource)),
            format_size(d.size) if d.size else "-", d.interleave_ways,
            dash(d.interleave_granularity), dash(d.region), route,
        ])  # fmt: skip
    emit_table(
        "Decoders",
        ["decoder", "kind", "port", "resource", "size", "ways", "gran", "region", "targets/mode"],
        rows,
    )


def _regions(system: System, sel: Selection, targets: bool) -> None:
    names = {nt.node.id: nt.name for nt in system.nodes}
    rows = []
    for r in sel.regions:
        members = [f"{m.position}:{m.memdev or m.decoder}" for m in r.mappings]
        rows.append([
            r.name, r.type, dash(None if r.resource is None else hex(r.resource)),
            format_size(r.size), r.interleave_ways, r.interleave_granularity, r.decode_state,
            " ".join(members) if targets else len(members),
            dash(", ".join(f"{n} ({names.get(n, '?')})" for n in r.numa_nodes)),
        ])  # fmt: skip
    emit_table(
        "Regions",
        ["region", "type", "resource", "size", "ways", "gran", "decode",
         "mappings" if targets else "memdevs", "numa node"],
        rows,
    )  # fmt: skip


def _nodes(sel: Selection) -> None:
    emit_table(
        "NUMA nodes",
        ["node", "name", "tier", "cpus", "total", "free", "source"],
        [[nt.node.id, nt.name, nt.tier, _cpus(nt.node.cpus), format_size(nt.node.mem_total),
          format_size(nt.node.mem_free),
          nt.region or ("explicit" if nt.explicit else "-")] for nt in sel.nodes],
    )  # fmt: skip


def _gpus(system: System, sel: Selection) -> None:
    if not sel.gpus and system.gpus.absent_reason:
        click.echo(click.style("GPUs", bold=True))
        click.echo(f"  (none: {system.gpus.absent_reason})\n")
        return
    emit_table(
        "GPUs",
        ["gpu", "name", "pci", "memory", "SMs", "cc", "nearest node"],
        [[g.target_name, g.name, g.pci_bus_id, format_size(g.total_memory), g.sm_count,
          "{}.{}".format(*g.compute_capability),
          f"{dash(g.numa_node)} ({g.numa_node_source})"] for g in sel.gpus],
    )  # fmt: skip


def _cpus(cpus: tuple[int, ...]) -> str:
    if not cpus:
        return "-"
    ranges, start, prev = [], cpus[0], cpus[0]
    for c in (*cpus[1:], -1):
        if c != prev + 1:
            ranges.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = c
        prev = c
    return ",".join(ranges)


def _summary(system: System, sel: Selection) -> None:
    if system.cxl.present:
        _memdevs(sel)
        _regions(system, sel, targets=True)
    _nodes(sel)
    _gpus(system, sel)
    for line in system.absent:
        click.echo(f"absent: {line}")
