"""pycxl top: live traffic per GPU link and per memory tier, as dmon lines for scripts
and logs, a refreshing table on a terminal, or JSON."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import click

from . import signals
from .params import COUNT, SECONDS, OutputFileType, PidType
from .render import emit_json_line, table

if TYPE_CHECKING:
    from pycxl.ops.top import Row, TopReport

MB = 1e6  # dmon and pcm-memory print MB/s of 10^6 bytes
HEADER_EVERY = 20  # reports between repeated headers in the line format, as dmon does


@click.command("top", context_settings={"allow_interspersed_args": False})
@click.option("-d", "--delay", type=SECONDS, default=1.0, show_default=True,
              help="Seconds between reports.")  # fmt: skip
@click.option("-c", "--count", type=COUNT, help="Stop after this many reports.")
@click.option("--once", is_flag=True, help="One report (-c 1).")
@click.option("-p", "--pid", type=PidType(), help="Also this process's memory per tier.")
@click.option("-b", "--batch", is_flag=True,
              help="Lines, as nvidia-smi dmon prints them, also on a terminal.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="One JSON object per report.")
@click.option("--textfile", type=OutputFileType(lambda: (".prom",)), metavar="FILE.prom",
              help="Also write each report's counters as Prometheus metrics (node_exporter "
                   "textfile collector), atomically.")  # fmt: skip
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND...]")
def top_command(delay: float, count: int | None, once: bool, pid: int | None, batch: bool,
                as_json: bool, textfile: str | None, command: tuple[str, ...]) -> None:  # fmt: skip
    """Live traffic per GPU link and per memory tier.

    Per GPU, bytes received and sent per second on its PCIe link (NVLink and C2C
    where NVML counts them) and how busy its memory is; per NUMA node, memory read
    and written (uncore and CXL device counters, resctrl) and page traffic
    (allocations, local and remote, promotions, demotions); each beside its link's
    bandwidth. A figure this host cannot count says why instead of showing a zero.
    With -p PID or -- COMMAND, also that process's memory per tier and its change;
    with COMMAND, top runs it, stops when it ends, and exits with its status.

    \b
    pycxl top                      (a table on a terminal, lines otherwise)
    pycxl top -c 10 -d 5 -b        (ten lines-reports, five seconds apart)
    pycxl top --once --json
    pycxl top -- python train.py
    """
    from pycxl.base.errors import InvalidRequestError

    if pid is not None and command:
        raise InvalidRequestError("give -p PID or a COMMAND to run, not both")
    if once:
        if count not in (None, 1):
            raise InvalidRequestError(f"--once is one report; -c {count} asks for {count}")
        count = 1
    show = _shower(as_json, batch or bool(command) or not _can_redraw())
    if not command:
        _run(delay, count, pid, show, textfile)  # a signal ends it (cli/signals.py)
        return
    # the signals that would end top go to the command, which top watches till it ends
    forward = _Forward()
    with signals.forwarded(forward):
        child = forward.start(command)
        try:
            # a command run ends the reports: top() ends after the one that shows it
            # ended (unreaped till child.wait() below, a zombie)
            _run(delay, count, child.pid, show, textfile)
        finally:  # whatever ended the reports (an error, a reader gone), the command ends first
            returncode = child.wait()
    raise click.exceptions.Exit(_status(returncode))


def _run(delay: float, count: int | None, pid: int | None, show: Callable[[TopReport], None],
         textfile: str | None) -> None:  # fmt: skip
    from pycxl.ops.top import top

    for report in top(delay, count, pid):
        if textfile:
            from pycxl.ops.metrics import top_metrics
            from pycxl.ops.prometheus import write_textfile

            write_textfile(textfile, top_metrics(report))
        show(report)


class _Forward:
    """Signals for top, sent on to its command (one that comes while it starts, once it
    runs); not the keyboard's, which the terminal gave the command too (it is in top's
    process group). The command is reaped only by child.wait(), so its PID is its own."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.held: list[int] = []

    def __call__(self, signum: int) -> None:
        if signals.from_keyboard(signum):
            return
        if self.pid is None:
            self.held.append(signum)
        else:
            os.kill(self.pid, signum)

    def start(self, command: Sequence[str]) -> subprocess.Popen[bytes]:
        from pycxl.numa.launch import find_command

        find_command(command)  # a typo is an error before anything runs
        child = subprocess.Popen(list(command))
        self.pid = child.pid
        for signum in self.held:
            os.kill(child.pid, signum)
        return child


def _status(returncode: int) -> int:
    """The command's exit status; one a signal ended ends top by that signal too (a shell
    reports 128 + the signal either way)."""
    return signals.end_by(-returncode) if returncode < 0 else returncode


def _can_redraw() -> bool:
    """Whether standard output is a terminal that can be cleared and redrawn: not a dumb
    one, nor one TERM does not name (top and watch print report after report there)."""
    if not sys.stdout.isatty():
        return False
    term = os.environ.get("TERM", "")
    if term in ("", "dumb"):
        return False
    try:
        import curses
    except ImportError:  # no terminal database to ask: a terminal TERM names redraws
        return True
    try:
        curses.setupterm(term, sys.stdout.fileno())
    except curses.error:  # a terminal the database does not know
        return False
    return curses.tigetstr("clear") is not None


def _shower(as_json: bool, lines: bool) -> Callable[[TopReport], None]:
    if as_json:
        from pycxl.ops.top import top_report_json

        return lambda report: emit_json_line(top_report_json(report))
    return _Lines() if lines else _refresh


# --- lines, as nvidia-smi dmon prints them ------------------------------------------------
GPU_HEADER = ("#time", "gpu", "link", "rx_MB/s", "tx_MB/s", "link%", "hbm%")
NODE_HEADER = ("#time", "node", "tier", "read_MB/s", "write_MB/s", "mbm_MB/s", "link%", "alloc/s",
               "local/s", "remote/s", "promoted/s", "demoted/s")  # fmt: skip
PROCESS_HEADER = ("#time", "pid", "node", "tier", "resident_MB", "change_MB/s", "anon_MB",
                  "anon_change_MB/s")  # fmt: skip


class _Lines:
    """One line per GPU, node and process node each report; headers at the start and
    every HEADER_EVERY reports; each missing figure's word explained once, as a comment."""

    def __init__(self) -> None:
        self.reports = 0
        self.explained: set[str] = set()

    def __call__(self, report: TopReport) -> None:
        from pycxl.ops.top import GPU_LINKS

        if self.reports == 0:
            click.echo(f"# pycxl top: every {report.interval_s:.2g} s; MB/s = 10^6 bytes/s; "
                       "link% = share of the link's bandwidth; a word where a figure "
                       "belongs says why it is missing")  # fmt: skip
            for row in report.gpus:
                click.echo(f"# {row.name}: {'; '.join(row.methods)}; " + _ceilings(row))
            for row in report.nodes:
                if row.ceilings:
                    click.echo(f"# {row.name}: " + _ceilings(row))
            for line in report.absent:
                click.echo(f"# absent: {line}")
        for short, (m, names) in report.missing.items():
            if short not in self.explained:
                click.echo(f"# {short} ({', '.join(names)}): {m.reason}")
                self.explained.add(short)
        when = _local_time(report.time)
        # each line beside the header whose columns it goes under
        lines: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
        if self.reports % HEADER_EVERY == 0:
            lines += [(GPU_HEADER, GPU_HEADER)] if report.gpus else []
            lines += [(NODE_HEADER, NODE_HEADER)]
            lines += [(PROCESS_HEADER, PROCESS_HEADER)] if report.process is not None else []
        for row in report.gpus:
            for link, (rx, tx) in GPU_LINKS.items():
                if link == "pcie" or rx in row.figures or rx in row.missing:
                    lines.append((GPU_HEADER, (when, row.name, link, _mb(row, rx), _mb(row, tx),
                                  _pct(row.share(link)), _pct(row.value("hbm_busy")))))  # fmt: skip
        for row in report.nodes:
            lines.append((NODE_HEADER, (when, row.name, row.tier, _mb(row, "mem_read"),
                          _mb(row, "mem_write"), _mb(row, "mbm_local"), _pct(row.share("memory")),
                          *(_n(row, f) for f in ("alloc", "local", "remote", "promoted",
                                                 "demoted")))))  # fmt: skip
        if report.process is not None:
            p = report.process
            for n in p.nodes:
                lines.append((PROCESS_HEADER, (when, str(p.pid), n.name, n.tier,
                              f"{n.resident / MB:.1f}", f"{n.change_per_s / MB:+.1f}",
                              f"{n.anonymous / MB:.1f}",
                              f"{n.anonymous_change_per_s / MB:+.1f}")))  # fmt: skip
        for header, fields in lines:
            click.echo(_aligned(fields, header))
        if report.process is not None and report.process.exited:
            click.echo(f"# {when} process {report.process.pid} ended")
        sys.stdout.flush()
        self.reports += 1


def _aligned(fields: tuple[str, ...], header: tuple[str, ...]) -> str:
    """A header or a line, columns right-aligned under ``header``'s names (each column
    as wide as its name, the time's as wide as a time)."""
    widths = [max(len(name), 8) for name in header]
    cells = [fields[0].ljust(widths[0])]
    cells += [f.rjust(w) for f, w in zip(fields[1:], widths[1:], strict=False)]
    return " ".join(cells).rstrip()


def _local_time(iso: str) -> str:
    import datetime

    return datetime.datetime.fromisoformat(iso).astimezone().strftime("%H:%M:%S")


def _mb(row: Row, figure: str) -> str:
    """A figure in MB/s, or the word for why it is missing."""
    return _shown(row, figure, lambda v: f"{v / MB:.1f}")


def _n(row: Row, figure: str) -> str:
    """A count per second, or the word for why it is missing."""
    return _shown(row, figure, lambda v: f"{v:.0f}")


def _shown(row: Row, figure: str, fmt: Callable[[float], str]) -> str:
    v = row.value(figure)
    if v is not None:
        return fmt(v)
    m = row.missing.get(figure)
    return m.short if m is not None else "-"


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.1f}"


def _ceilings(row: Row) -> str:
    parts = [f"{link} {c.bytes_per_s / 1e9:.1f} GB/s{' per direction' if c.duplex else ''} "
             f"({c.basis})" for link, c in row.ceilings.items()]  # fmt: skip
    return "ceiling " + "; ".join(parts) if parts else "no known ceiling"


# --- a table on a terminal, redrawn each report ----------------------------------------------
def _refresh(report: TopReport) -> None:
    from pycxl.ops.top import GPU_LINKS

    title = f"pycxl top  {report.time}  every {report.interval_s:g} s  (Ctrl-C to quit)"
    out: list[str] = [click.style(title, bold=True), ""]
    if report.gpus:
        rows: list[list[str]] = []
        for row in report.gpus:
            for link, (rx, tx) in GPU_LINKS.items():
                if link == "pcie" or rx in row.figures or rx in row.missing:
                    c = row.ceilings.get(link)
                    rows.append([row.name, link, _rate(row, rx), _rate(row, tx),
                                 _gbs(c.bytes_per_s) if c else "-", _pct(row.share(link)),
                                 _pct(row.value("hbm_busy"))])  # fmt: skip
        out += [table(["gpu", "link", "rx/s", "tx/s", "link max/dir", "link%", "hbm busy%"],
                      rows), ""]  # fmt: skip
    rows = []
    for row in report.nodes:
        c = row.ceilings.get("memory")
        rows.append([row.name, str(row.id), row.tier, _rate(row, "mem_read"),
                     _rate(row, "mem_write"), _rate(row, "mbm_local"),
                     _gbs(c.bytes_per_s) if c else "-",
                     _pct(row.share("memory")),
                     *(_n(row, f) for f in ("alloc", "local", "remote", "promoted",
                                            "demoted"))])  # fmt: skip
    headers = ["target", "node", "tier", "read/s", "write/s", "mbm/s", "max", "link%", "alloc/s",
               "local/s", "remote/s", "promoted/s", "demoted/s"]  # fmt: skip
    out += [table(headers, rows), ""]
    if report.process is not None:
        p = report.process
        rows = [[n.name, str(n.node), n.tier, _size(n.resident), _signed(n.change_per_s),
                 _size(n.anonymous), _signed(n.anonymous_change_per_s)]
                for n in p.nodes]  # fmt: skip
        heading = f"process {p.pid}" + (" (ended)" if p.exited else "")
        out += [click.style(heading, bold=True),
                table(["target", "node", "tier", "resident", "change/s", "anonymous",
                       "anon change/s"], rows), ""]  # fmt: skip
    for short, (m, names) in report.missing.items():
        out.append(f"{short} ({', '.join(names)}): {m.reason}")
    out += [f"absent: {line}" for line in report.absent]
    click.clear()
    click.echo("\n".join(out))


def _rate(row: Row, figure: str) -> str:
    return _shown(row, figure, lambda v: _gbs(v) if v >= 1e9 else f"{v / MB:.1f} MB/s")


def _gbs(v: float) -> str:
    return f"{v / 1e9:.2f} GB/s"


def _size(n: int) -> str:
    from pycxl.base.units import format_size

    return format_size(n)


def _signed(v: float) -> str:
    from pycxl.base.units import format_size

    return ("-" if v < 0 else "+") + format_size(int(abs(v)))
