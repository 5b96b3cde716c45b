"""pycxl testbed: try pycxl against a real kernel with emulated CXL devices."""

from __future__ import annotations

import shlex
import sys

import click

from pycxl.testbed.inject import KINDS as INJECT_KINDS
from pycxl.testbed.progress import STALL_TIMEOUT_S
from pycxl.testbed.topologies import DEFAULT_TOPOLOGY, TOPOLOGIES

from .params import WHOLE_SECONDS


@click.command("testbed", context_settings={"allow_interspersed_args": False})
@click.option("-t", "--topology", default=DEFAULT_TOPOLOGY, show_default=True,
              type=click.Choice(sorted(TOPOLOGIES)), help="Emulated CXL topology.")  # fmt: skip
@click.option("--list-topologies", is_flag=True, help="Describe the topologies and exit.")
@click.option("--setup", "setup_only", is_flag=True,
              help="Check requirements and fetch the kernel, then exit.")  # fmt: skip
@click.option("--timeout", type=WHOLE_SECONDS, default=int(STALL_TIMEOUT_S),
              show_default=True,
              help="Emulator CPU seconds COMMAND may run without new output (or three times "
                   "as many wall seconds) before the boot is ended and COMMAND runs again in "
                   "a fresh one (3 boots at most).")  # fmt: skip
@click.option("--inject", type=click.Choice(sorted(INJECT_KINDS)),
              help="Inside the testbed: inject this fault into an emulated device.")  # fmt: skip
@click.option("--memdev", metavar="MEMDEV",
              help="The memdev to inject into (name or serial; default: the first).")  # fmt: skip
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="Override a field of the injection (QEMU's argument names: dpa=4096, "
                   "health-status=4).")  # fmt: skip
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def testbed_command(
    topology: str, list_topologies: bool, setup_only: bool, timeout: int, inject: str | None,
    memdev: str | None, settings: tuple[str, ...], command: tuple[str, ...],
) -> None:  # fmt: skip
    """Boot a real Linux kernel under QEMU with emulated CXL memory and run COMMAND in it.

    Example: pycxl testbed -t four-dev -- pycxl list -M -R
    The host's file system is visible read-only in the guest; the exit status is
    COMMAND's. With no COMMAND, runs 'pycxl list'.
    """
    from pycxl.testbed import check_requirements, run_in_guest

    if inject is not None:
        _inject(inject, memdev, settings)
        return
    if memdev or settings:
        raise click.UsageError("--memdev and --set go with --inject")
    if list_topologies:
        for t in TOPOLOGIES.values():
            click.echo(f"{t.name}: {t.description}")
        return
    check_requirements()
    if setup_only:
        _setup()
        return
    argv = list(command) or ["pycxl", "list"]
    if argv[0] == "pycxl":  # this interpreter's pycxl, whatever PATH the guest has
        argv = [sys.executable, "-m", "pycxl.cli.main", *argv[1:]]
    cmd = shlex.join(argv)
    result = run_in_guest(
        cmd, topology, timeout=timeout, on_output=lambda line: click.echo(line, nl=False)
    )
    if result.returncode:
        raise click.exceptions.Exit(result.returncode)


def _setup() -> None:
    """Everything the testbed uses is present (the optional parts too), and the kernel."""
    from pycxl.base.errors import NotAvailableError
    from pycxl.testbed.kernel import INSTALL_HINT, missing_recommended, prepare_kernel

    missing = missing_recommended()
    if missing:
        raise NotAvailableError(
            "the testbed can boot, but is missing: "
            + "; ".join(missing)
            + f". Install: {INSTALL_HINT}"
        )
    kernel = prepare_kernel()
    click.echo(f"testbed ready: kernel {kernel.version}")


def _inject(kind: str, memdev: str | None, settings: tuple[str, ...]) -> None:
    """Guest side of fault injection: the harness on the host passes it to QEMU."""
    import json

    from pycxl.resolve.system import snapshot
    from pycxl.testbed.inject import check_request, request

    arguments: dict[str, object] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.UsageError(f"--set {item!r}: write KEY=VALUE")
        try:
            arguments[key] = json.loads(value)  # numbers, lists, true/false
        except ValueError:
            arguments[key] = value  # words: log=warning
    check_request(kind, arguments)  # bad fields first, wherever it runs
    cxl = snapshot(gpus=False).cxl.require()
    target = cxl.find_memdev(memdev) if memdev else (cxl.memdevs[0] if cxl.memdevs else None)
    if target is None or target.serial is None:
        raise click.UsageError("no memdev with a serial number to inject into")
    sent = request(kind, target.serial, arguments)
    click.echo(f"injected {kind} into {target.name} (serial {target.serial:#x}): "
               f"{sent['command']} {json.dumps(sent['arguments'], sort_keys=True)}")  # fmt: skip
