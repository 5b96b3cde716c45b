"""pycxl check: one command for the top of a job script (exit status says it all)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .exit_codes import CHECK_FAILURE, CHECK_WARNING, NOT_AVAILABLE
from .params import CountType, InputFileType, OutputFileType, sysroot_option
from .render import emit_json, emit_table

if TYPE_CHECKING:
    from pycxl.ops.check import CheckReport

STATUS_EXIT = {"ok": 0, "no-cxl": NOT_AVAILABLE, "warning": CHECK_WARNING, "failure": CHECK_FAILURE}


@click.command("check")
@click.option("-e", "--expect", "expect", multiple=True, metavar="NAME=SIZE",
              help="A node the job needs, with its capacity: cxl0=512G (repeat).")  # fmt: skip
@click.option("--expect-regions", type=CountType(minimum=0), metavar="N",
              help="How many CXL regions there must be.")  # fmt: skip
@click.option("--expect-memdevs", type=CountType(minimum=0), metavar="N",
              help="How many CXL memdevs there must be.")  # fmt: skip
@click.option(
    "-f",
    "--expect-file",
    type=InputFileType(),
    metavar="FILE",
    help="Expectations, one per line (cxl0=512G, regions=2, memdevs=4; # comments).",
)
@click.option("--events", "event_log", type=InputFileType(empty_is_off=True), metavar="FILE",
              help="The event log 'pycxl monitor --log' writes (default: "
                   "/var/log/pycxl/events.jsonl when it exists; '' for none).")  # fmt: skip
@click.option("--no-health", is_flag=True, help="Skip the devices' mailboxes and poison lists.")
@click.option("-q", "--quiet", is_flag=True, help="Show only warnings and failures.")
@click.option("--json", "as_json", is_flag=True, help="Findings as JSON.")
@click.option("--oneline", is_flag=True,
              help="One line: the worst finding (and how many more), or the counts when "
                   "all is well; for a drain reason or a log.")  # fmt: skip
@click.option("--textfile", type=OutputFileType(lambda: (".prom",)), metavar="FILE.prom",
              help="Also write the findings, health, regions and links as Prometheus metrics "
                   "(node_exporter textfile collector), atomically.")  # fmt: skip
@sysroot_option("Check a recorded sysfs tree instead of the live one.")
def check_command(
    expect: tuple[str, ...], expect_regions: int | None, expect_memdevs: int | None,
    expect_file: str | None, event_log: str | None, no_health: bool, quiet: bool,
    as_json: bool, oneline: bool, textfile: str | None, sysroot: str | None,
) -> None:  # fmt: skip
    """Check that this host's memory is as a job needs it.

    Every memdev enabled and healthy and in a region, every region committed and
    online, CXL nodes in a zone that keeps GPU-pinned memory, PCIe links at their
    best, poison lists empty, and the expectations given. Exit status: 0 all good,
    6 warnings, 7 failures, 4 no CXL memory here (nothing else wrong and nothing
    expected: expectations that all held exit 0).
    """
    from pycxl.ops.check import parse_expectations, read_event_log, read_expect_file, run_check

    if as_json and oneline:
        raise click.UsageError("give --json or --oneline, not both")
    from pycxl.resolve.system import snapshot

    items = list(expect)
    if expect_file:
        exp_file = parse_expectations(read_expect_file(expect_file), f"{expect_file}:")
        items += [f"{k}={v}" for k, v in exp_file.capacities.items()]
        items += [f"{k}={v}" for k, v in exp_file.counts.items()]
    if expect_regions is not None:
        items.append(f"regions={expect_regions}")
    if expect_memdevs is not None:
        items.append(f"memdevs={expect_memdevs}")
    expectations = parse_expectations(items)
    if event_log:
        read_event_log(event_log)  # a file that is not the monitor's log: say so now
    # GPUs from the driver's files (else the PCI bus), no library: a check must be quick
    system = snapshot(sysroot, gpus="files")
    # a recorded tree has no devices to ask: its check is of what sysfs shows
    ask_devices = not no_health and sysroot is None
    report = run_check(system, expectations, event_log=event_log, device_health=ask_devices,
                       fs=system.sysfs())  # fmt: skip
    if textfile:
        from pycxl.ops.metrics import check_metrics
        from pycxl.ops.prometheus import write_textfile

        write_textfile(textfile, check_metrics(report, system))
    if oneline:
        click.echo(one_line(report))
    elif as_json:
        from pycxl.ops.check_finding import finding_json

        emit_json({
            "status": report.status,
            "findings": [finding_json(f) for f in report.findings
                         if not quiet or f.severity in ("warning", "failure")],
        })  # fmt: skip
    else:
        shown = [f for f in report.findings if not quiet or f.severity in ("warning", "failure")]
        if shown:
            emit_table(None, ["severity", "check", "subject", "finding", "fix"],
                       [[f.severity, f.check, f.subject, f.message, f.fix or "-"]
                        for f in shown])  # fmt: skip
        click.echo(f"pycxl check: {report.status} ({_counts(report)})")
    code = STATUS_EXIT[report.status]
    if code:
        raise click.exceptions.Exit(code)


def _counts(report: CheckReport) -> str:
    return ", ".join(f"{sum(1 for f in report.findings if f.severity == s)} {s}"
                     for s in ("ok", "info", "warning", "failure"))  # fmt: skip


def one_line(report: CheckReport) -> str:
    """'failure: region0: 1 of 4 memory blocks ... [region-online] (+1 more)', or the
    status and the counts when nothing is wrong."""
    bad = [f for f in report.findings if f.severity == "failure"]
    bad += [f for f in report.findings if f.severity == "warning"]
    if not bad:
        return f"{report.status}: {_counts(report)}"
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return f"{report.status}: {bad[0].message} [{bad[0].check}]{more}"
