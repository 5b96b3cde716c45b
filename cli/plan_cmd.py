"""pycxl plan-train: whether a model trains with its state on a tier, before any memory
is taken (the CLI of ``pycxl.fit``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from pycxl.base.values import MAX_LAYERS, MAX_TOKENS, MAX_WIDTH
from pycxl.torch.offload.train_shape import MAX_INTERMEDIATE, MAX_VOCAB

from .exit_codes import DOES_NOT_FIT
from .params import AS_JSON, PARAMETERS, RATE, SIZE, CountType
from .render import emit_json, emit_table

LAYERS = CountType(maximum=MAX_LAYERS)
TOKENS = CountType(maximum=MAX_TOKENS)

if TYPE_CHECKING:
    from pycxl.torch.offload.fit import Fit, Option


@click.command("plan-train")
@click.option(
    "--params",
    "params",
    type=PARAMETERS,
    default=None,
    help="The model's parameters (13B, 350M); default: counted from the shape.",
)
@click.option("--layers", type=LAYERS, required=True, help="Repeated blocks (decoder layers).")
@click.option("--hidden", type=CountType(maximum=MAX_WIDTH), required=True, help="Hidden size.")
@click.option(
    "--intermediate",
    type=CountType(maximum=MAX_INTERMEDIATE),
    default=None,
    help="The MLP's intermediate size (default: Llama's, 8/3 of hidden).",
)
@click.option(
    "--vocab",
    type=CountType(maximum=MAX_VOCAB),
    default=32000,
    show_default=True,
    help="Vocabulary size.",
)
@click.option("--tied", is_flag=True, help="The embedding and the head are one matrix.")
@click.option(
    "--tokens", type=TOKENS, required=True, help="Tokens a micro-batch (batch x sequence)."
)
@click.option("--seq", type=TOKENS, default=None, help="Sequence length (default: --tokens).")
@click.option(
    "--accumulation",
    type=TOKENS,
    default=1,
    show_default=True,
    help="Micro-batches a step (gradient accumulation).",
)
@click.option(
    "--update-in-backward",
    is_flag=True,
    help="The loop does not clip: the update runs beside the backward pass "
    "(offload_model's update_in_backward); otherwise it begins at step().",
)
@click.option(
    "--tier",
    default="dram0",
    show_default=True,
    help="Where the optimizer state would live (dram0, cxl0, node ids).",
)
@click.option("--gpu", default=None, help="The GPU to train on (default: gpu0; not with --hbm).")
@click.option(
    "--hbm",
    "hbm_free",
    type=SIZE,
    default=None,
    help="Free GPU memory to plan for (a GPU elsewhere: nothing is read of one here).",
)
@click.option(
    "--tier-free",
    type=SIZE,
    default=None,
    help="Free memory on the tier to plan for (default: what it has free now).",
)
@click.option(
    "--link",
    type=RATE,
    default=None,
    help="GB/s each way between HBM and the tier (default: measured on the GPU).",
)
@click.option(
    "--tflops",
    type=RATE,
    default=None,
    help="The GPU's sustained bf16 TFLOP/s (default: measured on the GPU).",
)
@click.option(
    "--cpu-update",
    type=RATE,
    default=None,
    help="G parameters/s of the CPU's Adam step on the tier (default: measured).",
)
@click.option(
    "--lookahead",
    type=CountType(minimum=0, maximum=MAX_LAYERS),
    default=1,
    show_default=True,
    help="Blocks copied ahead when weights are streamed.",
)
@AS_JSON
def plan_train_command(params: int | None, layers: int, hidden: int, intermediate: int | None,
                       vocab: int, tied: bool, tokens: int, seq: int | None,
                       accumulation: int, update_in_backward: bool, tier: str,
                       gpu: str | None, hbm_free: int | None,
                       tier_free: int | None, link: float | None, tflops: float | None,
                       cpu_update: float | None, lookahead: int,
                       as_json: bool) -> None:  # fmt: skip
    """Whether a decoder of this shape trains under offload_model (its blocks' optimizer
    state on TIER, their weights resident on the GPU or streamed, with or without
    activation checkpointing), where each part would live, and the step's bound, from
    this machine's free memory and measured rates. Exit 8 where nothing fits.

    \b
    pycxl plan-train --params 13B --layers 40 --hidden 5120 --tokens 4096
    pycxl plan-train --layers 32 --hidden 4096 --tokens 8192 --seq 4096 --tier cxl0
    pycxl plan-train --params 8B --layers 32 --hidden 4096 --tokens 4096 --hbm 80G --link 50
    """
    import pycxl

    if gpu is not None and hbm_free is not None:
        raise pycxl.InvalidRequestError(
            "--gpu reads a GPU here and --hbm plans for one elsewhere: give one of them"
        )
    shape = pycxl.TrainShape.decoder(layers=layers, hidden=hidden, intermediate=intermediate,
                                     vocab=vocab, params=params, tied=tied)  # fmt: skip
    system = pycxl.snapshot(gpus=hbm_free is None)
    if hbm_free is None:
        gpu = gpu or "gpu0"
        try:
            system.gpu(gpu)
        except (pycxl.NotFoundError, pycxl.NotAvailableError) as e:
            e.args = (f"{e}; to plan for a GPU elsewhere, give its free memory (--hbm 80G) "
                      "and its rates (--link, --tflops)",)  # fmt: skip
            raise
    plan = pycxl.fit(
        shape, tier, None if hbm_free is not None else gpu, tokens=tokens, seq=seq,
        lookahead=lookahead, accumulation=accumulation, update_in_backward=update_in_backward,
        hbm_free=hbm_free, tier_free=tier_free,
        link=None if link is None else link * 1e9,
        cpu_update=None if cpu_update is None else cpu_update * 1e9,
        gpu_flops=None if tflops is None else tflops * 1e12, system=system,
    )  # fmt: skip
    if as_json:
        emit_json(plan.to_dict())
    else:
        _show(plan)
    if plan.chosen is None:
        if as_json:
            click.echo(f"pycxl plan-train: {plan.why}", err=True)
        raise click.exceptions.Exit(DOES_NOT_FIT)


def _show(plan: Fit) -> None:
    m = plan.machine
    rates = [
        f"HBM free {_gib(m.hbm_free)}" if m.hbm_free is not None else "HBM free not known",
        f"{m.tier} free {_gib(m.tier_free)}",
        f"link {m.link / 1e9:.1f} GB/s" if m.link else "link not known",
        f"CPU update {m.cpu_update / 1e9:.2f} G params/s" if m.cpu_update else "CPU not known",
        f"GPU {m.gpu_flops / 1e12:.0f} TFLOP/s" if m.gpu_flops else "GPU rate not known",
    ]
    if m.shared:
        rates.insert(4, f"beside each other {m.shared[0] / 1e9:.2f} G params/s and "
                        f"{m.shared[1] / 1e9:.1f} GB/s")  # fmt: skip
    s = plan.shape
    click.echo(f"{s.params / 1e9:.2f} B parameters ({s.block_params / 1e9:.2f} B in {s.layers} "
               f"blocks), {plan.tokens} tokens a step; {', '.join(rates)}")  # fmt: skip
    rows = [
        [o.name, _gib(sum(o.hbm.values())), _gib(sum(o.tier.values())),
         "yes" if o.fits else _short(o, m.tier),
         "-" if o.step_s is None else f"{o.step_s * 1e3:.0f} ms", o.bound]
        for o in plan.options
    ]  # fmt: skip
    emit_table(None, ["weights", "HBM", m.tier, "fits", "step (bound)", "why"], rows)
    shown = plan.chosen or min(plan.options, key=lambda o: (o.short_hbm, o.short_tier))
    from pycxl.torch.offload.fit import PARTS

    places = (("HBM", shown.hbm), (m.tier, shown.tier))
    parts = [[where, PARTS[part], _gib(n)] for where, d in places for part, n in d.items()]
    emit_table(f"weights {shown.name}:", ["where", "what", "bytes"], parts)
    click.echo(plan.why)


def _short(o: Option, tier: str) -> str:
    need = []
    if o.short_hbm:
        need.append(f"HBM {_gib(o.short_hbm)} short")
    if o.short_tier:
        need.append(f"{tier} {_gib(o.short_tier)} short")
    return "no: " + ", ".join(need)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
