"""pycxl stat: memory-tiering counters per node, as vmstat shows memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .params import COUNT, FiniteType, OutputFileType, sysroot_option
from .render import emit_json_line, emit_table

if TYPE_CHECKING:
    from pycxl.ops.stat import StatReport


@click.command("stat")
@click.argument("interval", required=False, type=FiniteType(metavar="INTERVAL"))
@click.argument("count", required=False, type=COUNT)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per report.")
@click.option("--textfile", type=OutputFileType(lambda: (".prom",)), metavar="FILE.prom",
              help="Also write each report as Prometheus metrics (node_exporter textfile "
                   "collector), atomically.")  # fmt: skip
@sysroot_option("Read a recorded tree instead of the live one.")
def stat_command(
    interval: float | None, count: int | None, as_json: bool, textfile: str | None,
    sysroot: str | None,
) -> None:  # fmt: skip
    """Memory tiers, like vmstat: [INTERVAL [COUNT]].

    The first report gives totals since boot; each later one, rates per second over
    INTERVAL: per node used and free memory, pinned memory, pages promoted and
    demoted, NUMA allocation misses; system-wide migrations and NUMA-balancing hint
    faults. With no INTERVAL, one report.
    """
    from pycxl.ops.stat import stat, stat_report_json, tiering_json
    from pycxl.resolve.system import snapshot

    system = snapshot(sysroot, gpus=False)
    for i, report in enumerate(stat(system, interval, count)):
        if textfile:
            from pycxl.ops.metrics import stat_metrics
            from pycxl.ops.prometheus import write_textfile

            write_textfile(textfile, stat_metrics(report))
        if as_json:
            emit_json_line(stat_report_json(report))
            continue
        if i == 0 and report.tiering is not None:
            _state(tiering_json(report.tiering))
        _table(report)


def _state(t: dict[str, object]) -> None:
    tiers = t["memory_tiers"]
    assert isinstance(tiers, dict)
    weights = t["interleave_weights"]
    assert isinstance(weights, dict)
    click.echo("memory tiers: " + ("; ".join(f"{k}: nodes {','.join(map(str, v))}"
                                              for k, v in tiers.items()) or "-"))  # fmt: skip
    click.echo(f"demotion: {_onoff(t['demotion_enabled'])}   numa_balancing: "
               f"{t['numa_balancing'] or '-'}   interleave weights: "
               + (" ".join(f"node{k}={v}" for k, v in weights.items()) or "-"))  # fmt: skip
    click.echo(f"cxl_pmu: {t['cxl_pmu']}")


def _onoff(value: object) -> str:
    return "-" if value is None else ("on" if value else "off")


def _table(report: StatReport) -> None:
    from pycxl.base.units import format_size

    rates = report.interval_s is not None
    unit = "/s" if rates else ""
    title = (f"{report.time}  rates over {report.interval_s:g} s" if rates
             else f"{report.time}  since boot")  # fmt: skip
    rows = []
    for n in report.nodes:
        v = n.rates if rates and n.rates is not None else n.totals
        rows.append([n.name, n.node, n.tier, "-" if n.memory_tier is None else n.memory_tier,
                     format_size(n.total), format_size(n.used), format_size(n.free),
                     format_size(n.pinned), _n(v.get("promoted")), _n(v.get("demoted")),
                     _n(v.get("numa_miss")), _n(v.get("numa_foreign"))])  # fmt: skip
    emit_table(title, ["target", "node", "tier", "mtier", "total", "used", "free", "pinned",
                       f"promoted{unit}", f"demoted{unit}", f"numa_miss{unit}",
                       f"numa_foreign{unit}"], rows)  # fmt: skip
    s = report.system_rates if rates and report.system_rates is not None else report.system_totals
    click.echo(f"system: migrated {_n(s.get('pgmigrate_success'))}{unit} pages "
               f"(failed {_n(s.get('pgmigrate_fail'))}{unit}), NUMA hint faults "
               f"{_n(s.get('numa_hint_faults'))}{unit} (local "
               f"{_n(s.get('numa_hint_faults_local'))}{unit}), balancing migrated "
               f"{_n(s.get('numa_pages_migrated'))}{unit}")  # fmt: skip


def _n(value: float | int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.1f}"
    return str(int(value))
