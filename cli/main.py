"""Entry point: the click group, logging to stderr, and exceptions to exit codes."""

from __future__ import annotations

import logging
import sys

import click

from pycxl import __version__
from pycxl.errors import PycxlError

from .bench_cmd import bench_group
from .exit_codes import exit_code_for
from .list_cmd import list_command
from .numa_cmd import numa_command, run_command, where_command
from .region_cmd import region_group
from .testbed_cmd import testbed_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pycxl")
@click.option("-v", "--verbose", is_flag=True, help="Log progress to stderr.")
def cli(verbose: bool) -> None:
    """See, configure and measure GPU HBM, CPU DRAM and CXL memory."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="pycxl: %(message)s",
        stream=sys.stderr,
    )


cli.add_command(list_command)
cli.add_command(region_group)
cli.add_command(numa_command)
cli.add_command(run_command)
cli.add_command(where_command)
cli.add_command(bench_group)
cli.add_command(testbed_command)


def main(argv: list[str] | None = None) -> int:
    try:
        # Commands that end with click's Exit (pycxl run: the child's status) return it.
        rc = cli.main(args=argv, prog_name="pycxl", standalone_mode=False)
    except PycxlError as e:
        click.echo(f"pycxl: error: {e}", err=True)
        return exit_code_for(e)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except click.exceptions.Exit as e:
        return e.exit_code
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
