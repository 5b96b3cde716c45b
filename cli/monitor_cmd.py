"""pycxl monitor: the kernel's CXL events and hotplug, one JSON line each."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import closing

import click

from .params import COUNT, SECONDS, OutputFileType
from .render import emit_json_line


@click.command("monitor")
@click.option("-c", "--count", type=COUNT, help="Stop after this many events.")
@click.option("--duration", type=SECONDS,
              help="Stop after this long.")  # fmt: skip
@click.option("-l", "--log", "log", type=OutputFileType(appends=True), metavar="FILE",
              help="Also append each event to FILE (what pycxl check --events reads).")  # fmt: skip
def monitor_command(count: int | None, duration: float | None, log: str | None) -> None:
    """Stream CXL events as JSON lines until interrupted.

    The kernel's CXL trace events (general media, DRAM, memory module, poison, AER)
    with the memdev, region, NUMA node and tier each concerns, and hotplug of CXL
    devices, regions, dax devices and memory blocks. Needs root (tracefs). Ctrl-C,
    SIGTERM or any signal that ends a program stops it, leaving tracing as it was.
    """
    from pycxl.ops.monitor import append_log, monitor

    # a signal (cli/signals.py) or a reader gone unwinds the stream: the trace instance
    # is removed, and tracefs unmounted if the monitor mounted it
    with closing(monitor(count=count, duration=duration, on_ready=_ready)) as events:
        for record in events:
            if log:
                append_log(log, record)
            emit_json_line(record)


def _ready(missing: Sequence[str]) -> None:
    if missing:
        click.echo("pycxl: this kernel lacks trace events " + ", ".join(missing)
                   + " (going on without them)", err=True)  # fmt: skip
    click.echo("pycxl: monitoring CXL events and hotplug (Ctrl-C to stop)", err=True)
