"""pycxl bench transfer|offload: GPUs copying from and computing on host tiers, and the
offload table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from pycxl.base.values import MAX_LAYERS, MAX_TOKENS, MAX_WIDTH

from ..params import PAGE_SIZE, CountType
from ..render import emit_json, emit_table
from .options import AS_JSON, samples_option
from .tables import emit_results, rate


@click.command("transfer")
@click.option("--gpu", "-g", required=True, metavar="GPU",
              help="gpu0, gpu1..., or all (every GPU at once).")  # fmt: skip
@click.option("--target", "-t", required=True, metavar="TARGET",
              help="Host memory: dram0, cxl0, node1.")  # fmt: skip
@click.option("--direction", type=click.Choice(["h2d", "d2h", "both", "bidir"]), default="both",
              show_default=True, help="both: one after the other; bidir: at once.")  # fmt: skip
@click.option("--pageable", is_flag=True, help="Unpinned memory, the driver's own copy.")
@click.option("--staged", is_flag=True, help="Unpinned memory, pycxl's pipelined copy.")
@click.option("--size", type=PAGE_SIZE, default=None, help="Bytes per copy (default: 1G).")
@samples_option(None, "Timed copies after two untimed ones (default: 20).")
@AS_JSON
def transfer_command(gpu: str, target: str, direction: str, pageable: bool, staged: bool,
                     size: int | None, samples: int | None, as_json: bool) -> None:  # fmt: skip
    """Copy bandwidth between GPUs and host memory on a tier."""
    from pycxl.bench import dispatch

    if pageable and staged:
        raise click.UsageError("--pageable and --staged: choose one (both copy unpinned memory)")
    memory = "staged" if staged else "pageable" if pageable else "pinned"
    results = dispatch.measure_transfer(gpu, target, direction=direction, size=size,
                                        memory=memory, samples=samples)  # fmt: skip
    emit_results(results, as_json)


@click.command("offload")
@click.option("--target", "-t", default="all", show_default=True, metavar="TARGETS",
              help="Host tiers the weights live on: dram0, cxl0, or all.")  # fmt: skip
@click.option("--gpu", "-g", default="gpu0", show_default=True, metavar="GPU")
@click.option("--layers", type=CountType(maximum=MAX_LAYERS), default=None,
              help="Layers in the stack (default: 16).")  # fmt: skip
@click.option("--width", type=CountType(minimum=8, maximum=MAX_WIDTH), default=None,
              help="Each layer is Linear(WIDTH, WIDTH) in bf16 (default: 8192).")  # fmt: skip
@click.option("--tokens", type=CountType(maximum=MAX_TOKENS), default=None,
              help="Rows of activations: the compute per layer (default: 1024).")  # fmt: skip
@click.option("--lookahead", type=CountType(minimum=0, maximum=MAX_LAYERS), default=1,
              show_default=True,
              help="Layers pycxl copies ahead of the one computing.")  # fmt: skip
@click.option("--backward", is_flag=True, help="Forward and backward (gradients to the tier).")
@click.option("--mode", "modes", default=None, metavar="MODES",
              help="hbm (always run), pycxl, to, pinned, update (with --backward: the "
                   "optimizer step, its state on the tier). Default: all of them.")  # fmt: skip
@samples_option(None, "Timed steps after two untimed ones (default: 5).")
@AS_JSON
def offload_command(target: str, gpu: str, layers: int | None, width: int | None,
                    tokens: int | None, lookahead: int, backward: bool, modes: str | None,
                    samples: int | None, as_json: bool) -> None:  # fmt: skip
    """Layers run on a GPU with their weights on host tiers: streamed by pycxl, against
    plain .to() copies, pinned copies without look-ahead, and all in HBM; with
    --backward, the optimizer step with its state on the tier against its bound."""
    from pycxl.bench import dispatch

    results = dispatch.measure_offload(
        target, gpu, modes=modes, layers=layers, width=width, tokens=tokens,
        lookahead=lookahead, backward=backward, samples=samples,
    )  # fmt: skip
    if as_json:
        from pycxl.measure.results import bench_result_json

        emit_json([bench_result_json(r) for r in results])
        return
    _emit_offload(results)


def _emit_offload(results: Sequence[Any]) -> None:  # update fields: set in update mode
    from pycxl.base.units import format_size

    first = results[0]
    pass_ = "forward+backward" if first.backward else "forward"
    click.echo(f"{first.layers} x Linear({first.width}, {first.width}) bf16 "
               f"({format_size(first.layer_bytes)} per layer), {first.tokens} tokens, "
               f"{pass_}, on {first.gpu}")  # fmt: skip
    together = any(r.alone_s is not None for r in results)
    rows = []
    for r in results:
        bound = "-"
        if r.mode == "update":
            bound = (f"{1e3 * r.bound_s:.1f} ms (CPU {_blocks(r.update_cpu_blocks)} at "
                     f"{r.update_cpu_rate / 1e9:.2f}, GPU {_blocks(r.update_gpu_blocks)} at "
                     f"{r.update_gpu_rate / 1e9:.2f} G parameters/s)")  # fmt: skip
        elif r.mode != "hbm":
            bound = (f"{1e3 * r.bound_s:.1f} ms (compute {1e3 * r.compute_s:.1f} ms, pinned "
                     f"{r.pinned_h2d_bytes_per_s / 1e9:.1f} GB/s)")  # fmt: skip
        row = [
            r.mode, r.initiator, r.target, "-" if r.node is None else r.node,
            f"{1e3 * r.step_s:.2f} ms", f"{r.vs_bound:.2f}x",
            "-" if r.hidden is None else f"{100 * r.hidden:.0f}%",
            "-" if r.link_bytes_per_s is None else rate(r.link_bytes_per_s),
            "-" if r.pages is None else f"{r.pages_on_node}/{r.pages}", bound,
        ]  # fmt: skip
        if together:
            row[2:2] = [r.at_once, "-" if r.alone_s is None else f"{r.step_s / r.alone_s:.2f}x"]
        rows.append(row)
    head = ["mode", "gpu", "weights on", "node", "step", "vs bound", "copy hidden", "link",
            "pages on node", "bound"]  # fmt: skip
    if together:
        head[2:2] = ["at once", "vs alone"]
    emit_table(None, head, rows)


def _blocks(layers: Sequence[int]) -> str:
    from pycxl.base.values import format_ranges

    return f"layers {format_ranges(list(layers))}" if layers else "no layer"
