"""pycxl list: CXL objects, NUMA nodes with tiers, GPUs (flags as ndctl's cxl list)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from pycxl.base.list_kinds import KINDS

from .params import sysroot_option
from .render import advertised, dash, emit_json, emit_table, near, pins, ranges, sockets

if TYPE_CHECKING:
    from pycxl.byname.listing import ListRequest, Selection
    from pycxl.pci.caps import CxlCapability, Unread
    from pycxl.pci.link import Link
    from pycxl.resolve.system import System


def _kind_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for k in reversed(KINDS):
        if k.filter_flag:
            f = click.option(
                f"-{k.filter_flag}", f"--{k.singular}", f"{k.name}_filter", multiple=True,
                metavar=k.filter_metavar,
                help=f"Only these {k.name} and what relates to them (repeat or comma-separate; "
                "all).",
            )(f)  # fmt: skip
        f = click.option(f"-{k.flag}", f"--{k.name}", k.name, is_flag=True, help=k.help)(f)
    return f


@click.command("list")
@_kind_options
@click.option("-s", "--serial", "serial_filter", multiple=True, metavar="SERIAL",
              help="Only memdevs with these serial numbers.")  # fmt: skip
@click.option("-T", "--targets", is_flag=True, help="Decoder targets, dports, region mappings.")
@click.option("-i", "--include-disabled", "--idle", is_flag=True,
              help="Also disabled objects.")  # fmt: skip
@click.option("-H", "--health", is_flag=True,
              help="Memdevs' health from their mailboxes (root).")  # fmt: skip
@click.option("-A", "--alert-config", is_flag=True,
              help="Memdevs' alert thresholds from their mailboxes (root).")  # fmt: skip
@click.option("-L", "--media-errors", is_flag=True,
              help="Memdevs' poison lists, with region and node (root).")  # fmt: skip
@click.option("-u", "--human", is_flag=True, help="Human sizes and hex addresses in JSON.")
@click.option("-v", "--verbose", "verbose", count=True,
              help="More objects and detail, as cxl list: -v every CXL object kind with "
                   "targets; -vv also disabled objects; -vvv also health, alert thresholds, "
                   "media errors (root) and dax devices. (pycxl -v LIST... logs "
                   "progress instead.)")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (ndctl fields).")
@click.option("--backend", type=click.Choice(["sysfs", "libcxl"]), default="sysfs",
              show_default=True, help="Where CXL objects are read from.")  # fmt: skip
@sysroot_option("Read a recorded sysfs tree instead of the live one.")
@click.option("--cuda", is_flag=True,
              help="Read GPUs through the CUDA driver: also L2 size, copy engines and "
              "host-memory flags (starts CUDA: about 0.25 s).")  # fmt: skip
def list_command(
    serial_filter: tuple[str, ...], targets: bool, include_disabled: bool, health: bool,
    alert_config: bool, media_errors: bool, human: bool, verbose: int, as_json: bool,
    backend: str, sysroot: str | None, cuda: bool, **kinds: Any,
) -> None:  # fmt: skip
    """List memory tiers: CXL objects, NUMA nodes, GPUs.

    With no flag, a summary: memdevs, regions, NUMA nodes with tier names, GPUs with
    their nearest node, and what is absent. A filter alone lists its own kind
    (-m mem0: that memdev; -d root: the root decoders), as cxl list does.
    """
    from pycxl.base.sysfs import Sysfs
    from pycxl.gpu.nvml_session import begin_reading

    # NVML waits about 18 ms on the driver: for a plain `list` or `list -G`, start it on a
    # thread before anything else is imported; for other requests snapshot() starts it,
    # if they show GPUs
    plain = not any(v for k, v in kinds.items() if k != "gpus") and not (
        serial_filter or health or alert_config or media_errors or verbose or cuda
    )
    if plain:
        begin_reading(Sysfs(sysroot))
    from pycxl.byname.listing import ListRequest, list_json, select

    req = ListRequest(
        kinds=frozenset(k.name for k in KINDS if kinds.get(k.name)),
        filters={k.name: _split(kinds.get(f"{k.name}_filter", ())) for k in KINDS
                 if kinds.get(f"{k.name}_filter")},
        serials=_split(serial_filter), targets=targets,
        include_disabled=include_disabled, human=human, health=health,
        alert_config=alert_config, media_errors=media_errors,
    ).verbose(verbose)  # fmt: skip
    # GPUs come from NVML or the driver's files; CUDA, slow to start, only with --cuda
    want_gpus = req.summary or "gpus" in req.shown
    gpus = want_gpus and ("cuda" if cuda else True)
    from pycxl.resolve.system import snapshot

    system = snapshot(sysroot, backend=backend, gpus=gpus)  # type: ignore[arg-type]
    if as_json:
        emit_json(list_json(system, req))
        return
    sel = select(system, req)
    if req.summary:
        _summary(system, sel)
        return
    for k in KINDS:
        if k.name in req.shown:
            RENDERERS[k.name](system, sel, req)
    if not system.cxl.present and any(k.cxl and k.name in req.shown for k in KINDS):
        click.echo(f"absent: {system.cxl.NO_BUS}")  # why the CXL tables are empty


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    """Filter values, comma- or blank-separated as ndctl takes them; a value that names
    nothing (an unset shell variable) is refused, never read as no filter."""
    out: list[str] = []
    for value in values:
        names = value.replace(",", " ").split()
        if not names:
            raise click.BadParameter(f"{value!r} names nothing: give a name such as mem0, or all")
        if any(not part.strip() for part in value.split(",")):
            raise click.BadParameter(f"{value!r} has an empty item: give names such as "
                                     "mem0,mem1, or all")  # fmt: skip
        out += names
    return tuple(out)


def _buses(system: System, sel: Selection, req: ListRequest) -> None:
    emit_table("Buses", ["bus", "provider"], [[b.name, b.provider] for b in sel.buses])


def _ports(system: System, sel: Selection, req: ListRequest, endpoints: bool = False) -> None:
    rows = [
        [p.name, p.kind, p.host, p.depth, dash(p.parent),
         ", ".join(f"{d.name}#{d.id}" for d in p.dports) if req.targets else len(p.dports)]
        for p in (sel.endpoints if endpoints else [p for p in sel.ports if p.kind != "root"])
    ]  # fmt: skip
    emit_table("Endpoints" if endpoints else "Ports",
               ["port", "kind", "host", "depth", "parent", "dports"], rows)  # fmt: skip


def _endpoints(system: System, sel: Selection, req: ListRequest) -> None:
    _ports(system, sel, req, endpoints=True)


def _memdevs(system: System, sel: Selection, req: ListRequest | None = None) -> None:
    from pycxl.base.units import format_size
    from pycxl.base.values import PARTITION_MODES
    from pycxl.byname.listing import device_links

    def size(n: int) -> str:
        return format_size(n) if n else "-"

    links = device_links(system, sel)
    emit_table(
        "CXL memdevs",
        ["memdev", "serial", "host", *PARTITION_MODES, "numa", "endpoint", "regions",
         "link", "CXLCap"],
        [[m.name, dash(None if m.serial is None else hex(m.serial)), m.host,
          *(size(m.partition_size(mode)) for mode in PARTITION_MODES), dash(m.numa_node),
          dash(m.endpoint.name if m.endpoint else None),
          dash(", ".join(r.name for r in m.regions)), _link(links[m.name][0]),
          _cxl(links[m.name][1])] for m in sel.memdevs],
    )  # fmt: skip
    if req is not None and req.device_info:
        _device_tables(system, sel, req)


def _device_tables(system: System, sel: Selection, req: ListRequest) -> None:
    """What the memdevs' mailboxes and poison lists say (-H, -A, -L)."""
    from pycxl.byname.memdev_health import read_device_info
    from pycxl.cxl.health import AlertConfig, Health

    info = read_device_info(system, sel.memdevs, req)
    unread = sorted({i.unavailable for i in info.values() if i.unavailable})
    for why in unread:
        click.echo(f"pycxl: {why}", err=True)
    if req.health:
        rows = []
        for m in sel.memdevs:
            dh = info[m.name].health
            h = dh.health if dh is not None else None
            if isinstance(h, Health):
                problems = ", ".join(h.problems)
                rows.append([m.name, problems or "ok",
                             "normal" if h.media_status == 0 else "problem",
                             "-" if h.life_used == 0xFF else f"{h.life_used}%",
                             "-" if h.temperature == -1 else f"{h.temperature} C",
                             h.dirty_shutdowns,
                             f"{h.volatile_errors}/{h.pmem_errors}"])  # fmt: skip
            else:
                why = info[m.name].unavailable or (h.reason if h is not None else "-")
                rows.append([m.name, f"not read: {why}", "-", "-", "-", "-", "-"])
        emit_table("Health", ["memdev", "health", "media", "life used", "temperature",
                              "dirty shutdowns", "corrected vol/pmem"], rows)  # fmt: skip
    if req.alert_config:
        rows = []
        for m in sel.memdevs:
            dh = info[m.name].health
            a = dh.alert_config if dh is not None else None
            if isinstance(a, AlertConfig):
                rows.append([m.name, f"{a.life_used_warn}/{a.life_used_crit}%",
                             f"{a.over_temp_warn}/{a.over_temp_crit} C",
                             f"{a.under_temp_warn}/{a.under_temp_crit} C",
                             a.volatile_err_warn, a.pmem_err_warn])  # fmt: skip
            else:
                why = info[m.name].unavailable or (a.reason if a is not None else "-")
                rows.append([m.name, f"not read: {why}", "-", "-", "-", "-"])
        emit_table("Alert thresholds (warning/critical)",
                   ["memdev", "life used", "over temp", "under temp", "corr vol warn",
                    "corr pmem warn"], rows)  # fmt: skip
    if req.media_errors:
        from pycxl.cxl.mailbox import Unsupported

        rows = []
        for m in sel.memdevs:
            p = info[m.name].poison
            if isinstance(p, Unsupported) or p is None:
                reason = p.reason if isinstance(p, Unsupported) else info[m.name].unavailable
                rows.append([m.name, f"not read: {reason or 'memdev disabled'}", "-", "-", "-",
                             "-", "-"])  # fmt: skip
                continue
            for r in p:
                region = next((x for x in system.cxl.regions if x.name == r.region), None)
                nodes = region.numa_nodes if region is not None else []
                node = nodes[0] if nodes else None
                rows.append([m.name, hex(r.dpa), r.length, r.source, dash(r.region),
                             dash(None if r.hpa is None else hex(r.hpa)),
                             dash(None if node is None else system.tier_name(node))])  # fmt: skip
            if not p:
                rows.append([m.name, "none", "-", "-", "-", "-", "-"])
        emit_table("Media errors (poison)", ["memdev", "offset", "length", "source", "region",
                                            "hpa", "target"], rows)  # fmt: skip


def _link(link: Link | None) -> str:
    return "-" if link is None else link.lspci_text()


def _cxl(cap: CxlCapability | Unread | None) -> str:
    """CXLCap's protocols and decoders as lspci writes them, or why not read."""
    from pycxl.pci.caps import Unread

    if cap is None:
        return "-"
    if isinstance(cap, Unread):
        return "(root)" if cap.reason.startswith("needs root") else "-"
    return cap.lspci_text()


def _decoders(system: System, sel: Selection, req: ListRequest) -> None:
    from pycxl.base.units import format_size

    rows = []
    for d in sel.decoders:
        if d.kind == "endpoint":
            route = f"{d.mode or '-'} dpa {format_size(d.dpa_size)}" if d.dpa_size else dash(d.mode)
        elif req.targets:
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


def _regions(system: System, sel: Selection, req: ListRequest | None = None) -> None:
    from pycxl.base.units import format_size
    from pycxl.numa.access import cpu_figures

    targets = req is None or req.targets
    rows = []
    for r in sel.regions:
        members = [f"{m.position}:{m.memdev or m.decoder}" for m in r.mappings]
        rows.append([
            r.name, r.type, dash(None if r.resource is None else hex(r.resource)),
            format_size(r.size), r.interleave_ways, r.interleave_granularity, r.decode_state,
            " ".join(members) if targets else len(members),
            dash(", ".join(f"{n} ({system.tier_name(n) or '?'})" for n in r.numa_nodes)),
            sockets(system, r.memdev_nodes), advertised(cpu_figures(r.access)),
        ])  # fmt: skip
    emit_table(
        "Regions",
        ["region", "type", "resource", "size", "ways", "gran", "decode",
         "mappings" if targets else "memdevs", "numa node", "memdevs on", "advertised"],
        rows,
    )  # fmt: skip


def _dax(system: System, sel: Selection, req: ListRequest) -> None:
    from pycxl.base.units import format_size

    emit_table(
        "Dax devices",
        ["dax", "region", "size", "mode", "node", "online blocks", "zone"],
        [[d.name, dash(d.region), format_size(d.size), d.mode, dash(d.target_node),
          f"{d.online_memblocks}/{d.total_memblocks}", dash(d.zone)] for d in sel.dax],
    )  # fmt: skip


def _nodes(system: System, sel: Selection, req: ListRequest | None = None) -> None:
    from pycxl.base.units import format_size

    emit_table(
        "NUMA nodes",
        ["node", "name", "tier", "cpus", "total", "free", "source", "zone", "pins", "near",
         "advertised"],
        [[nt.node.id, nt.name, nt.tier, ranges(nt.node.cpus), format_size(nt.node.mem_total),
          format_size(nt.node.mem_free), nt.region or ("explicit" if nt.explicit else "-"),
          dash(nt.zone), pins(nt.holds_longterm_pins, nt.zone), near(system, nt),
          advertised(nt.node.advertised)] for nt in sel.numa],
    )  # fmt: skip


def _gpus(system: System, sel: Selection, req: ListRequest | None = None) -> None:
    from pycxl.base.units import format_size
    from pycxl.byname.listing import device_links

    if not sel.gpus and system.gpus.absent_reason:
        click.echo(click.style("GPUs", bold=True))
        click.echo(f"  (none: {system.gpus.absent_reason})\n")
        return
    links = device_links(system, sel)
    emit_table(
        "GPUs",
        ["gpu", "name", "pci", "memory", "SMs", "cc", "nearest node", "link"],
        [[g.target_name, g.name, g.pci_bus_id,
          dash(None if g.total_memory is None else format_size(g.total_memory)),
          dash(g.sm_count), dash(g.cc_text),
          f"{dash(g.numa_node)} ({g.numa_node_source})", _link(links[g.target_name][0])]
         for g in sel.gpus],
    )  # fmt: skip


RENDERERS: dict[str, Callable[[System, Selection, ListRequest], None]] = {
    "buses": _buses,
    "ports": _ports,
    "endpoints": _endpoints,
    "memdevs": _memdevs,
    "decoders": _decoders,
    "regions": _regions,
    "dax": _dax,
    "numa": _nodes,
    "gpus": _gpus,
}


def _summary(system: System, sel: Selection) -> None:
    if system.cxl.present:
        _memdevs(system, sel, None)
        _regions(system, sel)
    _nodes(system, sel)
    _gpus(system, sel)
    for line in system.absent:
        click.echo(f"absent: {line}")
