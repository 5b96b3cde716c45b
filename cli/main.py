"""Entry point: the click group, logging to stderr, and every error to one line and an
exit code (usage errors, pycxl's errors, and bugs alike); a signal or a reader gone
ends pycxl as that signal does (cli/signals.py)."""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

import click

from pycxl import __version__
from pycxl.base.errors import PycxlError

from . import signals
from .exit_codes import FAILED, INTERNAL, USAGE, exit_code_for
from .signals import Terminated

_verbose = False
_stdout_failed = False

# Each command's module is imported when that command runs (or for --help), so a
# command pays only for what it uses: 'pycxl list' never loads the benchmarks.
COMMANDS = {
    "list": ("list_cmd", "list_command"),
    "region": ("region_cmd", "region_group"),
    "numa": ("numa_cmd", "numa_command"),
    "run": ("numa_cmd", "run_command"),
    "where": ("numa_cmd", "where_command"),
    "pin-probe": ("numa_cmd", "pin_probe_command"),
    "bench": ("bench", "bench_group"),
    "testbed": ("testbed_cmd", "testbed_command"),
    "check": ("check_cmd", "check_command"),
    "monitor": ("monitor_cmd", "monitor_command"),
    "stat": ("stat_cmd", "stat_command"),
    "labels": ("labels_cmd", "labels_command"),
    "spill": ("spill_cmd", "spill_command"),
    "plan-train": ("plan_cmd", "plan_train_command"),
    "top": ("top_cmd", "top_command"),
    "memdev": ("memdev_cmd", "memdev_group"),
    "port": ("port_cmd", "port_group"),
    "bus": ("port_cmd", "bus_group"),
}


class _PipeBroke(BaseException):
    """A BrokenPipeError carried past click, which would end pycxl with status 1 and
    nothing said (it takes EPIPE for itself, even outside its standalone mode)."""

    def __init__(self, error: BrokenPipeError) -> None:
        super().__init__(str(error))
        self.error = error


@contextlib.contextmanager
def _past_click() -> Iterator[None]:
    try:
        yield
    except BrokenPipeError as e:
        raise _PipeBroke(e) from e


class LazyGroup(click.Group):
    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with _past_click():  # --help and --version print here
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _past_click():
            return super().invoke(ctx)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(f".{module}", __package__), attr)
        assert isinstance(command, click.Command)
        return command


# Commands whose own output is not pycxl's: run becomes the command it starts, which
# meets its standard output itself (as under numactl).
_STDOUT_NOT_OURS = frozenset({"run", "spill"})
# spill runs a Python program in this interpreter: signals stay as Python has them for it
_SIGNALS_NOT_OURS = frozenset({"spill"})


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="pycxl")
@click.option("-v", "--verbose", is_flag=True, help="Log progress (and tracebacks) to stderr.")
def cli(verbose: bool) -> None:
    """See, configure and measure GPU HBM, CPU DRAM and CXL memory."""
    global _verbose
    _verbose = verbose
    from pycxl.base._log import log_to_stderr

    log_to_stderr(verbose)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    # A closed standard output (>&-) is found before anything runs (--help and --version
    # too): click drops what it cannot write, so a command would work and say nothing.
    command = _command(args)
    if sys.stdout is None and command not in _STDOUT_NOT_OURS:
        return _write_error("Bad file descriptor (standard output is closed)")
    restore = signals.install() if command not in _SIGNALS_NOT_OURS else lambda: None
    try:
        with signals.raising():
            return _dispatch(args)
    except Terminated as e:
        return _signalled(e.signum)
    except _PipeBroke as e:
        return _broken_pipe(e.error)
    except BrokenPipeError as e:  # met while saying what failed
        return _broken_pipe(e)
    finally:
        restore()


def _command(args: list[str]) -> str | None:
    return next((a for a in args if not a.startswith("-")), None)


def _dispatch(args: list[str]) -> int:
    try:
        rc = cli.main(args=args, prog_name="pycxl", standalone_mode=False)
    except PycxlError as e:
        click.echo(f"pycxl: error: {e}", err=True)
        return exit_code_for(e)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.format_message(), err=True)
        return USAGE
    except click.UsageError as e:
        click.echo(f"pycxl: error: {e.format_message()}", err=True)
        if e.ctx is not None:
            click.echo(f"Try '{e.ctx.command_path} --help' for help.", err=True)
        return USAGE
    except (click.exceptions.Abort, KeyboardInterrupt):  # Python's own Ctrl-C (spill's program)
        return _signalled(signal.SIGINT)
    except click.ClickException as e:
        click.echo(f"pycxl: error: {e.format_message()}", err=True)
        return e.exit_code or FAILED
    except click.exceptions.Exit as e:
        return e.exit_code
    except OSError as e:
        if not _writing_stdout(e):
            return _internal_error(e)
        return _write_error(e.strerror or str(e))
    except Exception as e:
        return _internal_error(e)
    return rc if isinstance(rc, int) else 0


def _signalled(signum: int) -> int:
    """A signal ended the command, after its clean-up: pycxl ends by it (Ctrl-C says so)."""
    if signum == signal.SIGINT:
        with contextlib.suppress(OSError):
            click.echo("pycxl: interrupted", err=True)
    return signals.end_by(signum)


def _broken_pipe(e: BrokenPipeError) -> int:
    """The reader of standard output went away (pycxl list | head): pycxl ends as SIGPIPE
    ends ndctl's cxl list, saying nothing; a pipe of its own that broke is a bug."""
    if signals.reader_gone():
        return signals.end_by(signal.SIGPIPE)
    return _internal_error(e)


def _internal_error(e: BaseException) -> int:
    """A bug: one line, the traceback only when asked for."""
    click.echo(f"pycxl: internal error: {type(e).__name__}: {e}", err=True)
    if _verbose:
        import traceback

        traceback.print_exception(e)
    else:
        click.echo("(run with -v for the traceback; please report it)", err=True)
    return INTERNAL


def _writing_stdout(e: OSError) -> bool:
    """Whether ``e`` was raised writing standard output: every line pycxl prints goes
    through click.echo, which flushes each call."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is click.echo.__code__:
            return not tb.tb_frame.f_locals.get("err")
        tb = tb.tb_next
    return False


def _write_error(reason: str) -> int:
    """As coreutils say it: one line, exit 1 (what was printed before stands)."""
    global _stdout_failed
    _stdout_failed = True
    click.echo(f"pycxl: write error: {reason}", err=True)
    return FAILED


def _discard_stdout() -> None:
    """What is still buffered for a standard output that failed goes nowhere, so the
    interpreter's own flush at exit does not fail again."""
    with contextlib.suppress(OSError):
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.close(fd)


def run() -> NoReturn:
    """The ``pycxl`` console script: ``main()``, then exit.

    Before the interpreter tears itself down, the objects left are moved out of the
    garbage collector's sight (``gc.freeze``): the final collections would walk every
    object the imports made (about 6 ms of ``pycxl list`` on a small machine, 15 ms on a GPU
    host whose site-packages load at start; docs/benchmarks.md). atexit
    handlers, the wait for threads and the flushing of streams still happen, and the
    process's memory goes back to the system as ever. A signal, or a reader gone, ends
    it by that signal instead, once main() has cleaned up (cli/signals.py)."""
    if _command(sys.argv[1:]) not in _SIGNALS_NOT_OURS:
        signals.install()  # for the process's life: a signal after main() is kept, ended by below
    rc = main()
    gc.freeze()
    try:  # what is still buffered meets a full disk here, not in the interpreter's exit
        if sys.stdout is not None and signals.ending() != signal.SIGPIPE:
            sys.stdout.flush()
    except BrokenPipeError:
        if signals.reader_gone():
            signals.end_by(signal.SIGPIPE)
        elif not _stdout_failed:
            rc = _write_error("Broken pipe")
    except OSError as e:
        if not _stdout_failed and signals.ending() is None:
            rc = _write_error(e.strerror or str(e))
    signum = signals.ending()
    if _stdout_failed or signum is not None:
        _discard_stdout()
    if signum is not None:
        signals.die(signum)
    sys.exit(rc)


if __name__ == "__main__":
    run()
