"""pycxl monitor: the kernel's CXL events and hotplug, one JSON line each."""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from contextlib import closing
from types import FrameType

import click

from .params import COUNT, SECONDS, OutputFileType
from .render import emit_json_line


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds the stream: the trace instance is removed


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
    devices, regions, dax devices and memory blocks. Needs root (tracefs). Stops
    cleanly on Ctrl-C or SIGTERM, leaving tracing as it was.
    """
    from pycxl.ops.monitor import append_log, monitor

    signal.signal(signal.SIGTERM, _stop)
    try:
        stream = monitor(count=count, duration=duration, on_ready=_ready)
        with closing(stream) as events:
            for record in events:
                if log:
                    append_log(log, record)
                emit_json_line(record)
    except KeyboardInterrupt:
        pass  # the way to stop a monitor; not an error
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (| head): stop quietly


def _ready(missing: Sequence[str]) -> None:
    if missing:
        click.echo("pycxl: this kernel lacks trace events " + ", ".join(missing)
                   + " (going on without them)", err=True)  # fmt: skip
    click.echo("pycxl: monitoring CXL events and hotplug (Ctrl-C to stop)", err=True)
