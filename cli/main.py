"""Entry point: the click group, logging to stderr, and every error to one line and an
exit code (usage errors, pycxl's errors, and bugs alike)."""

from __future__ import annotations

import gc
import importlib
import sys
from typing import NoReturn

import click

from pycxl import __version__
from pycxl.errors import PycxlError

from .exit_codes import FAILED, INTERNAL, INTERRUPTED, USAGE, exit_code_for

_verbose = False

# Each command's module is imported when that command runs (or for --help), so a
# command pays only for what it uses: 'pycxl list' never loads the benchmarks.
COMMANDS = {
    "list": ("list_cmd", "list_command"),
    "region": ("region_cmd", "region_group"),
    "numa": ("numa_cmd", "numa_command"),
    "run": ("numa_cmd", "run_command"),
    "where": ("numa_cmd", "where_command"),
    "pin-probe": ("numa_cmd", "pin_probe_command"),
    "bench": ("bench_cmd", "bench_group"),
    "testbed": ("testbed_cmd", "testbed_command"),
    "check": ("check_cmd", "check_command"),
    "monitor": ("monitor_cmd", "monitor_command"),
    "stat": ("stat_cmd", "stat_command"),
    "labels": ("labels_cmd", "labels_command"),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(f".{module}", __package__), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="pycxl")
@click.option("-v", "--verbose", is_flag=True, help="Log progress (and tracebacks) to stderr.")
def cli(verbose: bool) -> None:
    """See, configure and measure GPU HBM, CPU DRAM and CXL memory."""
    global _verbose
    _verbose = verbose
    from pycxl._log import log_to_stderr

    log_to_stderr(verbose)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    try:
        rc = cli.main(args=argv, prog_name="pycxl", standalone_mode=False)
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
    except click.exceptions.Abort:
        click.echo("pycxl: interrupted", err=True)
        return INTERRUPTED
    except KeyboardInterrupt:
        click.echo("pycxl: interrupted", err=True)
        return INTERRUPTED
    except click.ClickException as e:
        click.echo(f"pycxl: error: {e.format_message()}", err=True)
        return e.exit_code or FAILED
    except click.exceptions.Exit as e:
        return e.exit_code
    except BrokenPipeError:
        return FAILED  # the reader went away (pycxl list | head): nothing to say
    except Exception as e:  # a bug: one line, the traceback only when asked for
        click.echo(f"pycxl: internal error: {type(e).__name__}: {e}", err=True)
        if _verbose:
            import traceback

            traceback.print_exc()
        else:
            click.echo("(run with -v for the traceback; please report it)", err=True)
        return INTERNAL
    return rc if isinstance(rc, int) else 0


def run() -> NoReturn:
    """The ``pycxl`` console script: ``main()``, then exit.

    Before the interpreter tears itself down, the objects left are moved out of the
    garbage collector's sight (``gc.freeze``): the final collections would walk every
    object the imports made (about 6 ms of ``pycxl list`` on a small machine, 15 ms on a GPU
    host whose site-packages load at start; docs/benchmarks.md). atexit
    handlers, the wait for threads and the flushing of streams still happen, and the
    process's memory goes back to the system as ever."""
    rc = main()
    gc.freeze()
    sys.exit(rc)


if __name__ == "__main__":
    run()
