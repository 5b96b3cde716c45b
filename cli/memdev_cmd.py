"""pycxl memdev VERB MEMDEV...: ndctl's memdev commands (read-labels, write-labels,
zero-labels, disable-memdev, enable-memdev, reserve-dpa, free-dpa, set-partition,
update-firmware, set-alert-config, sanitize and wait-sanitize, inject-media-poison and
clear-media-poison), each validated first, planned, and shown with --dry-run."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from pycxl.base.values import PARTITION_MODES

from .device_output import each_object, emit_results
from .params import (
    AS_JSON,
    DRY_RUN,
    INTEGER,
    MILLISECONDS,
    OBJECT_NAMES,
    SIZE,
    WRITES_SYSROOT,
    InputFileType,
    IntParam,
    OutputFileType,
    SizeType,
    flatten,
    sysroot_option,
)

if TYPE_CHECKING:
    from pycxl.base.sysfs import Sysfs
    from pycxl.cxl.device_ops import DeviceResult

MEMDEVS = click.argument("memdevs", nargs=-1, required=True, metavar="MEMDEV... | all",
                         type=OBJECT_NAMES)  # fmt: skip
ONE_MEMDEV = click.argument("memdev", metavar="MEMDEV")
LABEL_SIZE = click.option("-s", "--size", type=SIZE, default=None,
                          help="Bytes of the label area (default: to its end).")  # fmt: skip
LABEL_OFFSET = click.option("-O", "--offset", type=SizeType(minimum=0), default="0",
                            help="Where in the label area to start (default: 0).")  # fmt: skip


class AddressType(IntParam):
    """A device physical address: 4096 or 0x1000."""

    name = "address"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from pycxl.base.errors import InvalidRequestError
        from pycxl.base.values import address_text

        if isinstance(value, int):
            return value
        try:
            return address_text(str(value), "address")
        except InvalidRequestError as e:
            self.fail(str(e), param, ctx)


# what asks a memdev's mailbox: a recorded tree has no device to ask
MAILBOX_SYSROOT = sysroot_option(
    "Plan on a recorded sysfs tree instead of this machine (with --dry-run, where the plan "
    "needs no answer from the device; anything else is refused: a tree has no device to ask)"
)
ADDRESS = click.option("-a", "--address", type=AddressType(), required=True,
                       help="Device physical address (DPA), 64-byte aligned: 0x1000.")  # fmt: skip


@click.group("memdev")
def memdev_group() -> None:
    """Operate CXL memory devices: labels, enable/disable, DPA, partition, firmware,
    alert thresholds, sanitize, poison (ndctl's cxl memdev commands)."""


def _host(sysroot: str | None) -> Sysfs:
    """The host tree a command reads and changes, opened once: the operations are handed
    it (``sysroot`` was checked by its option)."""
    from pycxl.base.sysfs import Sysfs

    return Sysfs(sysroot)


def _memdevs(names: tuple[tuple[str, ...], ...], fs: Sysfs) -> list[str]:
    """The memdevs named ('all': every one), each checked to exist before any write."""
    from pycxl.cxl.device_ops import topology

    topo = topology(fs)
    wanted = flatten(names)
    if "all" in wanted:
        return [m.name for m in topo.memdevs]
    return list(dict.fromkeys(topo.find_memdev(n).name for n in wanted))


def _run(names: tuple[tuple[str, ...], ...], fs: Sysfs, as_json: bool, key: str,
         op: Callable[[str], DeviceResult]) -> None:  # fmt: skip
    each_object(_memdevs(names, fs), op, as_json, key)


# --- labels ------------------------------------------------------------------------
@memdev_group.command("read-labels")
@MEMDEVS
@click.option("-o", "--output", type=OutputFileType(stdout=True), default=None, metavar="FILE",
              help="File to write the label data to ('-' or none: standard output).")  # fmt: skip
@LABEL_SIZE
@LABEL_OFFSET
@MAILBOX_SYSROOT
def read_labels_command(memdevs: tuple[tuple[str, ...], ...], output: str | None,
                        size: int | None, offset: int, sysroot: str | None) -> None:  # fmt: skip
    """Read memdevs' label storage areas (binary, one after another), as cxl read-labels."""
    from pycxl.base.outfiles import STDOUT, write_atomically
    from pycxl.cxl.label_area import read_labels

    fs = _host(sysroot)
    data = b"".join(read_labels(m, size=size, offset=offset, system=fs)
                    for m in _memdevs(memdevs, fs))  # fmt: skip
    if output is None or output == STDOUT:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    write_atomically(output, data)


@memdev_group.command("write-labels")
@ONE_MEMDEV
@click.option("-i", "--input", "infile", type=InputFileType(), required=True,
              help="File holding the label data.")  # fmt: skip
@click.option("-s", "--size", type=SIZE, default=None,
              help="Bytes of the file to write (default: all of it).")  # fmt: skip
@LABEL_OFFSET
@DRY_RUN
@AS_JSON
@MAILBOX_SYSROOT
def write_labels_command(memdev: str, infile: str, size: int | None, offset: int,
                         dry_run: bool, as_json: bool, sysroot: str | None) -> None:  # fmt: skip
    """Write a file into one memdev's label area (the bytes it replaces are restored if
    the write fails)."""
    from pycxl.base.errors import InvalidRequestError
    from pycxl.cxl.label_area import write_labels

    fs = _host(sysroot)
    with open(infile, "rb") as f:
        data = f.read()
    if size is not None:
        if size > len(data):
            raise InvalidRequestError(f"--size {size}: {infile} has only {len(data)} bytes")
        data = data[:size]
    emit_results([write_labels(memdev, data, offset=offset, system=fs, dry_run=dry_run)],
                 as_json, "memdev")  # fmt: skip


@memdev_group.command("zero-labels")
@MEMDEVS
@LABEL_SIZE
@LABEL_OFFSET
@DRY_RUN
@AS_JSON
@MAILBOX_SYSROOT
def zero_labels_command(memdevs: tuple[tuple[str, ...], ...], size: int | None, offset: int,
                        dry_run: bool, as_json: bool, sysroot: str | None) -> None:  # fmt: skip
    """Zero memdevs' label areas."""
    from pycxl.cxl.label_area import zero_labels

    fs = _host(sysroot)
    _run(memdevs, fs, as_json, "memdev",
         lambda m: zero_labels(m, size=size, offset=offset, system=fs,
                               dry_run=dry_run))  # fmt: skip


# --- in and out of service -----------------------------------------------------------
@memdev_group.command("disable")
@MEMDEVS
@click.option("-f", "--force", is_flag=True,
              help="Disable a memdev that still decodes an active region (its memory "
                   "vanishes under whatever uses it).")  # fmt: skip
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def disable_command(memdevs: tuple[tuple[str, ...], ...], force: bool, dry_run: bool,
                    as_json: bool, sysroot: str | None) -> None:  # fmt: skip
    """Take memdevs out of service: unbind them from cxl_mem (cxl disable-memdev)."""
    from pycxl.cxl.binding import disable_memdev

    fs = _host(sysroot)
    _run(memdevs, fs, as_json, "memdev",
         lambda m: disable_memdev(m, force=force, system=fs, dry_run=dry_run))  # fmt: skip


@memdev_group.command("enable")
@MEMDEVS
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def enable_command(memdevs: tuple[tuple[str, ...], ...], dry_run: bool, as_json: bool,
                   sysroot: str | None) -> None:  # fmt: skip
    """Bring memdevs back into service: bind them to cxl_mem (cxl enable-memdev)."""
    from pycxl.cxl.binding import enable_memdev

    fs = _host(sysroot)
    _run(memdevs, fs, as_json, "memdev",
         lambda m: enable_memdev(m, system=fs, dry_run=dry_run))  # fmt: skip


# --- DPA and partitions ----------------------------------------------------------------
DPA_TYPE = click.option("-t", "--type", "mode", type=click.Choice(PARTITION_MODES),
                        default=None, help="Capacity to reserve from (default: ram).")  # fmt: skip
DPA_DECODER = click.option("-d", "--decoder", default=None, metavar="DECODER",
                           help="The endpoint decoder (decoder2.1, or 1); default: the "
                                "next in sequence.")  # fmt: skip
DPA_FORCE = click.option("-f", "--force", is_flag=True,
                         help="Try a decoder out of sequence, or more than is free (the "
                              "kernel may refuse).")  # fmt: skip


@memdev_group.command("reserve-dpa")
@MEMDEVS
@click.option("-s", "--size", type=SIZE, default=None,
              help="Bytes to reserve, a multiple of 256M (default: all that is free).")  # fmt: skip
@DPA_TYPE
@DPA_DECODER
@DPA_FORCE
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def reserve_dpa_command(memdevs: tuple[tuple[str, ...], ...], size: int | None,
                        mode: str | None, decoder: str | None, force: bool, dry_run: bool,
                        as_json: bool, sysroot: str | None) -> None:  # fmt: skip
    """Reserve device capacity (DPA) on memdevs' next free endpoint decoder."""
    from pycxl.cxl.dpa import reserve_dpa

    fs = _host(sysroot)
    _run(memdevs, fs, as_json, "decoder",
         lambda m: reserve_dpa(m, size=size, mode=mode or "ram", decoder=decoder, force=force,
                               system=fs, dry_run=dry_run))  # fmt: skip


@memdev_group.command("free-dpa")
@MEMDEVS
@DPA_TYPE
@DPA_DECODER
@DPA_FORCE
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def free_dpa_command(memdevs: tuple[tuple[str, ...], ...], mode: str | None,
                     decoder: str | None, force: bool, dry_run: bool, as_json: bool,
                     sysroot: str | None) -> None:  # fmt: skip
    """Free memdevs' newest DPA reservation that no region uses."""
    from pycxl.cxl.dpa import free_dpa

    fs = _host(sysroot)
    _run(memdevs, fs, as_json, "decoder",
         lambda m: free_dpa(m, mode=mode, decoder=decoder, force=force, system=fs,
                            dry_run=dry_run))  # fmt: skip


@memdev_group.command("set-partition")
@MEMDEVS
@click.option("-t", "--type", "mode", type=click.Choice(PARTITION_MODES), default="pmem",
              show_default=True, help="Partition that --size is for.")  # fmt: skip
@click.option(
    "-s",
    "--size",
    type=SIZE,
    default=None,
    help="Bytes of that partition (default: all the capacity that can change).",
)
@click.option("-a", "--align", is_flag=True, help="Round --size to the partition alignment.")
@DRY_RUN
@AS_JSON
@MAILBOX_SYSROOT
def set_partition_command(memdevs: tuple[tuple[str, ...], ...], mode: str, size: int | None,
                          align: bool, dry_run: bool, as_json: bool,
                          sysroot: str | None) -> None:  # fmt: skip
    """Split memdevs' capacity between ram and pmem, from their next reset."""
    from pycxl.cxl.partition import set_partition

    fs = _host(sysroot)
    _run(memdevs, fs, as_json, "partition",
         lambda m: set_partition(m, mode=mode, size=size, align=align, system=fs,
                                 dry_run=dry_run))  # fmt: skip


# --- firmware, alerts, sanitize --------------------------------------------------------
@memdev_group.command("update-firmware")
@MEMDEVS
@click.option("-F", "--firmware-file", "image", type=InputFileType(), default=None,
              help="Firmware image to send to the device.")  # fmt: skip
@click.option("-c", "--cancel", is_flag=True, help="Abort an update under way.")
@click.option("-w", "--wait", is_flag=True, help="Return once the device has taken it.")
@DRY_RUN
@AS_JSON
@MAILBOX_SYSROOT
def update_firmware_command(memdevs: tuple[tuple[str, ...], ...], image: str | None,
                            cancel: bool, wait: bool, dry_run: bool, as_json: bool,
                            sysroot: str | None) -> None:  # fmt: skip
    """Update memdevs' firmware through the kernel's firmware loader."""
    from pycxl.cxl import firmware

    if cancel and image:
        raise click.UsageError("--cancel and --firmware-file go separately")
    if not cancel and not image:
        raise click.UsageError("give --firmware-file FILE (or --cancel)")
    fs = _host(sysroot)
    if cancel:
        _run(memdevs, fs, as_json, "firmware",
             lambda m: firmware.cancel_firmware_update(m, system=fs,
                                                       dry_run=dry_run))  # fmt: skip
        return
    assert image is not None
    _run(memdevs, fs, as_json, "firmware",
         lambda m: firmware.update_firmware(m, image, wait=wait, system=fs,
                                            dry_run=dry_run))  # fmt: skip


def _alert_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """ndctl's pairs: --<alert>-threshold N with --<alert>-alert on|off."""
    for flag, short, what in reversed(ALERT_FLAGS):
        f = click.option(f"--{flag}-alert", type=click.Choice(["on", "off"]), default=None,
                         help=f"Turn the {what} warning alert on or off.")(f)  # fmt: skip
        f = click.option(f"-{short}", f"--{flag}-threshold", type=INTEGER, default=None,
                         metavar="N", help=f"The {what} warning threshold.")(f)  # fmt: skip
    return f


ALERT_FLAGS = (
    ("life-used", "L", "life used (%)"),
    ("over-temperature", "O", "over temperature (C)"),
    ("under-temperature", "U", "under temperature (C)"),
    ("volatile-mem-err", "V", "corrected volatile memory error count"),
    ("pmem-err", "P", "corrected persistent memory error count"),
)


@memdev_group.command("set-alert-config")
@MEMDEVS
@_alert_options
@DRY_RUN
@AS_JSON
@MAILBOX_SYSROOT
def set_alert_config_command(memdevs: tuple[tuple[str, ...], ...], dry_run: bool,
                             as_json: bool, sysroot: str | None,
                             **alerts: Any) -> None:  # fmt: skip
    """Set memdevs' warning thresholds (ndctl's cxl set-alert-config)."""
    from pycxl.cxl.alerts import AlertChange, alert_change, set_alert_config

    changes: list[AlertChange] = []
    for flag, _, _ in ALERT_FLAGS:
        key = flag.replace("-", "_")  # ndctl's flag names are the alerts' names
        c = alert_change(key, alerts[f"{key}_alert"], alerts[f"{key}_threshold"])
        if c is not None:
            changes.append(c)
    fs = _host(sysroot)
    _run(memdevs, fs, as_json, "alert_config",
         lambda m: set_alert_config(m, changes, system=fs, dry_run=dry_run))  # fmt: skip


@memdev_group.command("sanitize")
@MEMDEVS
@click.option("--erase", is_flag=True, help="Secure erase (change the media's keys) instead.")
@click.option("-f", "--force", is_flag=True,
              help="Required for a device with persistent capacity (its data is "
                   "lost).")  # fmt: skip
@click.option("-w", "--wait", is_flag=True, help="Return once it has finished.")
@click.option("-t", "--timeout", type=MILLISECONDS, default=None, metavar="MS",
              help="With --wait: milliseconds to wait at most (default: as long as it "
                   "takes).")  # fmt: skip
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def sanitize_command(memdevs: tuple[tuple[str, ...], ...], erase: bool, force: bool, wait: bool,
                     timeout: int | None, dry_run: bool, as_json: bool,
                     sysroot: str | None) -> None:  # fmt: skip
    """Overwrite all of memdevs' media (or, --erase, change its keys)."""
    from pycxl.cxl.sanitize import sanitize

    seconds = None if timeout is None else timeout / 1000
    fs = _host(sysroot)
    _run(memdevs, fs, as_json, "sanitize",
         lambda m: sanitize(m, erase=erase, force=force, wait=wait, timeout=seconds,
                            system=fs, dry_run=dry_run))  # fmt: skip


@memdev_group.command("wait-sanitize")
@MEMDEVS
@click.option("-t", "--timeout", type=MILLISECONDS, default=None, metavar="MS",
              help="Milliseconds to wait at most (default: as long as it takes).")  # fmt: skip
@WRITES_SYSROOT
def wait_sanitize_command(memdevs: tuple[tuple[str, ...], ...], timeout: int | None,
                          sysroot: str | None) -> None:  # fmt: skip
    """Wait for memdevs' sanitize to finish (at once where none runs)."""
    from pycxl.cxl.sanitize import wait_sanitize

    fs = _host(sysroot)
    for m in _memdevs(memdevs, fs):
        waited = wait_sanitize(m, timeout=None if timeout is None else timeout / 1000,
                               system=fs)  # fmt: skip
        click.echo(f"{m}: no sanitize running (waited {waited:.1f} s)")


# --- poison ----------------------------------------------------------------------------
@memdev_group.command("inject-media-poison")
@ONE_MEMDEV
@ADDRESS
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def inject_poison_command(memdev: str, address: int, dry_run: bool, as_json: bool,
                          sysroot: str | None) -> None:  # fmt: skip
    """Poison a 64-byte line of a memdev, to test the alerting path (pycxl list -L, check,
    monitor)."""
    from pycxl.cxl.poison import inject_poison

    fs = _host(sysroot)
    emit_results([inject_poison(memdev, address, system=fs, dry_run=dry_run)], as_json,
                 "poison")  # fmt: skip


@memdev_group.command("clear-media-poison")
@ONE_MEMDEV
@ADDRESS
@DRY_RUN
@AS_JSON
@WRITES_SYSROOT
def clear_poison_command(memdev: str, address: int, dry_run: bool, as_json: bool,
                         sysroot: str | None) -> None:  # fmt: skip
    """Clear the poison of a 64-byte line of a memdev."""
    from pycxl.cxl.poison import clear_poison

    fs = _host(sysroot)
    emit_results([clear_poison(memdev, address, system=fs, dry_run=dry_run)], as_json,
                 "poison")  # fmt: skip
