"""pycxl labels: this host's memory as Slurm node attributes or Kubernetes node labels."""

from __future__ import annotations

import os

import click

from pycxl.base.values import TEN_YEARS_S

from .params import CountType, OutputFileType, sysroot_option
from .render import emit_json


@click.command("labels")
@click.option("-F", "--format", "fmt", type=click.Choice(["slurm", "nfd", "json"]), required=True,
              help="slurm: Features= and Gres= for slurm.conf; nfd: a node-feature-discovery "
                   "feature file; json: the facts.")  # fmt: skip
@click.option("-o", "--output", type=OutputFileType(stdout=True), metavar="FILE",
              help="Write to FILE atomically (a reader sees the old file or the new one) "
                   "instead of stdout ('-': stdout). Only a regular file is "
                   "written.")  # fmt: skip
@click.option("--ttl", type=CountType(maximum=TEN_YEARS_S), metavar="SECONDS",
              help="nfd: the labels expire this long after writing, unless written "
                   "again.")  # fmt: skip
@click.option("--no-health", is_flag=True,
              help="Leave out the check's status (no check runs).")  # fmt: skip
@sysroot_option("Label a recorded sysfs tree instead of this host.")
def labels_command(
    fmt: str, output: str | None, ttl: int | None, no_health: bool, sysroot: str | None
) -> None:
    """This host's memory as scheduler labels.

    The memory tiers present, the CXL capacity online, whether memory pinned for a
    GPU stays on the CXL nodes (their zone), and (nfd, json) the status of pycxl
    check. --format slurm prints Features= (cxl, cxl_gib:N, cxl_pinnable) and
    Gres=cxl_mem:no_consume:SIZE; --format nfd a feature file for
    /etc/kubernetes/node-feature-discovery/features.d.
    """
    from pycxl.base.errors import InvalidRequestError
    from pycxl.base.outfiles import STDOUT, write_atomically
    from pycxl.base.sysfs import Sysfs
    from pycxl.ops.labels import host_labels, host_labels_json, nfd_file, slurm_attributes
    from pycxl.resolve.system import snapshot

    if output == STDOUT:
        output = None
    if ttl is not None and fmt != "nfd":
        raise InvalidRequestError(f"--ttl applies to --format nfd, not {fmt}")
    if output and fmt == "nfd" and os.path.basename(output).startswith("."):
        raise InvalidRequestError(
            f"--output {output}: node-feature-discovery skips hidden files; "
            "give a name that does not start with '.'"
        )
    fs = Sysfs(sysroot)
    # GPUs from the driver's files (else the PCI bus), no library: as pycxl check
    system = snapshot(fs, gpus="files")
    report = None
    if fmt != "slurm" and not no_health:
        from pycxl.ops.check import run_check

        report = run_check(system, device_health=sysroot is None, fs=fs)
    labels = host_labels(system, report, fs)
    if fmt == "slurm":
        text = slurm_attributes(labels) + "\n"
    elif fmt == "nfd":
        text = nfd_file(labels, ttl)
    else:
        if not output:
            emit_json(host_labels_json(labels))
            return
        import json

        text = json.dumps(host_labels_json(labels), indent=2) + "\n"
    if output:
        write_atomically(output, text)
    else:
        click.echo(text, nl=False)
