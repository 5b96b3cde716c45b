"""pycxl port disable|enable|inject-protocol-error and pycxl bus disable|enable
(ndctl's disable-port, enable-port, inject-protocol-error and disable-bus)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .device_output import each_object, emit_results
from .params import AS_JSON, DRY_RUN, OBJECT_NAMES, WRITES_SYSROOT, flatten

if TYPE_CHECKING:
    from pycxl.base.sysfs import Sysfs

PORTS = click.argument("ports", nargs=-1, required=True, metavar="PORT... | all",
                       type=OBJECT_NAMES)  # fmt: skip
ENDPOINT = click.option("-e", "--endpoint", is_flag=True,
                        help="The ports named are endpoint ports (endpoint2, or the "
                             "memdev).")  # fmt: skip


def _host(sysroot: str | None) -> Sysfs:
    """The host tree a command reads and changes, opened once: the operations are handed
    it (``sysroot`` was checked by its option)."""
    from pycxl.base.sysfs import Sysfs

    return Sysfs(sysroot)


def _ports(names: tuple[tuple[str, ...], ...], endpoint: bool, fs: Sysfs) -> list[str]:
    from pycxl.cxl.binding import find_port
    from pycxl.cxl.device_ops import topology

    topo = topology(fs)
    wanted = flatten(names)
    if "all" in wanted:
        pool = topo.endpoints if endpoint else topo.ports
        return [p.name for p in pool if p.kind != "root"]
    return list(dict.fromkeys(find_port(topo, n, endpoint=endpoint).name for n in wanted))


@click.group("port")
def port_group() -> None:
    """Take CXL ports (switches, host bridges, endpoints) out of service and back."""


@port_group.command("disable")
@PORTS
@ENDPOINT
@click.option("-f", "--force", is_flag=True,
              help="Disable a port above memdevs that still decode an active region.")  # fmt: skip
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def disable_command(ports: tuple[tuple[str, ...], ...], endpoint: bool, force: bool,
                    dry_run: bool, as_json: bool, sysroot: str | None) -> None:  # fmt: skip
    """Unbind ports from cxl_port; the endpoints below go with them (cxl disable-port)."""
    from pycxl.cxl.binding import disable_port

    fs = _host(sysroot)
    each_object(_ports(ports, endpoint, fs),
                lambda p: disable_port(p, endpoint=endpoint, force=force, system=fs,
                                       dry_run=dry_run), as_json, "port")  # fmt: skip


@port_group.command("enable")
@PORTS
@ENDPOINT
@click.option("-m", "--enable-memdevs", is_flag=True,
              help="Also enable the disabled memdevs below (their endpoints come "
                   "back).")  # fmt: skip
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def enable_command(ports: tuple[tuple[str, ...], ...], endpoint: bool, enable_memdevs: bool,
                   dry_run: bool, as_json: bool, sysroot: str | None) -> None:  # fmt: skip
    """Bind ports to cxl_port (cxl enable-port)."""
    from pycxl.cxl.binding import enable_port

    fs = _host(sysroot)
    each_object(_ports(ports, endpoint, fs),
                lambda p: enable_port(p, endpoint=endpoint, enable_memdevs=enable_memdevs,
                                      system=fs, dry_run=dry_run),
                as_json, "port")  # fmt: skip


@port_group.command("inject-protocol-error")
@click.argument("dport", metavar="DPORT")
@click.option("-t", "--type", "error", required=True,
              type=click.Choice(["cache-correctable", "cache-uncorrectable", "cache-fatal",
                                 "mem-correctable", "mem-uncorrectable", "mem-fatal"]),
              help="The CXL protocol error to inject.")  # fmt: skip
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def inject_protocol_error_command(dport: str, error: str, dry_run: bool, as_json: bool,
                                  sysroot: str | None) -> None:  # fmt: skip
    """Inject a CXL protocol error at a downstream port (0000:0c:00.0) through the
    platform's ACPI EINJ (cxl inject-protocol-error)."""
    from pycxl.cxl.protocol_errors import inject_protocol_error

    fs = _host(sysroot)
    emit_results([inject_protocol_error(dport, error, system=fs, dry_run=dry_run)],
                 as_json, "port")  # fmt: skip


@click.group("bus")
def bus_group() -> None:
    """Take a whole CXL root (bus) out of service and back."""


@bus_group.command("disable")
@click.argument("buses", nargs=-1, required=True, metavar="BUS...", type=OBJECT_NAMES)
@click.option("-f", "--force", is_flag=True,
              help="Disable a bus above memdevs that still decode an active region.")  # fmt: skip
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def bus_disable_command(buses: tuple[tuple[str, ...], ...], force: bool, dry_run: bool,
                        as_json: bool, sysroot: str | None) -> None:  # fmt: skip
    """Unbind CXL roots (root0, ACPI.CXL) from cxl_acpi: everything under them goes
    (cxl disable-bus)."""
    from pycxl.cxl.binding import disable_bus

    fs = _host(sysroot)
    each_object(list(flatten(buses)),
                lambda b: disable_bus(b, force=force, system=fs, dry_run=dry_run),
                as_json, "bus")  # fmt: skip


@bus_group.command("enable")
@click.argument("host", default="ACPI0017:00", metavar="[HOST]")
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def bus_enable_command(host: str, dry_run: bool, as_json: bool, sysroot: str | None) -> None:
    """Bind a CXL root's platform device (default ACPI0017:00) to cxl_acpi again: its
    ports and memdevs are found afresh."""
    from pycxl.cxl.binding import enable_bus

    fs = _host(sysroot)
    emit_results([enable_bus(host, system=fs, dry_run=dry_run)], as_json, "bus")
