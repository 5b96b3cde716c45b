"""pycxl bench: measurements by name, one module per family of commands (host tiers,
loaded latency, GPUs, the matrix), beside the tables, plots and progress bar they
share."""

from __future__ import annotations

import click

from . import gpu, host, loaded, matrix


@click.group("bench")
def bench_group() -> None:
    """Measure memory tiers: latency, bandwidth, first touch, GPU transfers."""


for _command in (
    host.latency_command,
    host.bandwidth_command,
    loaded.loaded_latency_command,
    host.first_touch_command,
    gpu.transfer_command,
    gpu.offload_command,
    matrix.matrix_command,
):
    bench_group.add_command(_command)
