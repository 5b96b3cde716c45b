"""The options the bench commands share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from pycxl.base.values import PAGE_SIZES

from ..params import SAMPLES, OutputFileType, plot_suffixes

AS_JSON = click.option("--json", "as_json", is_flag=True, help="A list of result objects.")
FROM = click.option(
    "--from",
    "initiator",
    default=None,
    metavar="INITIATOR",
    help="Who accesses: dram0, node0, cpu3, gpu0 (default: CPUs nearest the target).",
)
TARGET = click.option("--target", "-t", required=True, metavar="TARGET",
                      help="Memory to measure: dram0, cxl0, node1, gpu0.")  # fmt: skip
PAGE = click.option(
    "--page-size", "page", type=click.Choice(PAGE_SIZES), default="4k", show_default=True
)
PLOT = click.option("--plot", type=OutputFileType(plot_suffixes), default=None,
                    metavar="FILE.png",
                    help="Draw the results (png, svg, pdf...: any format matplotlib writes; "
                         "the path is checked before measuring).")  # fmt: skip


def samples_option(default: int | None, what: str) -> Callable[[Any], Any]:
    return click.option("-n", "--samples", type=SAMPLES, default=default,
                        show_default=default is not None, help=what)  # fmt: skip
