"""pycxl spill: run a Python program whose CUDA out-of-memory spills onto a tier."""

from __future__ import annotations

import os
import runpy
import sys
import traceback

import click


@click.command("spill", context_settings={"allow_interspersed_args": False})
@click.option("-m", "module", default=None, metavar="MODULE",
              help="Run a module as python -m does, instead of a script.")  # fmt: skip
@click.option("--log", "log_spills", is_flag=True,
              help="Log each spill (size, tier, Python call site) on stderr; also "
                   "PYCXL_SPILL_LOG=1.")  # fmt: skip
@click.argument("tier")
@click.argument("program", nargs=-1, type=click.UNPROCESSED)
def spill_command(module: str | None, log_spills: bool, tier: str,
                  program: tuple[str, ...]) -> None:  # fmt: skip
    """Run the Python program PROGRAM (a script and its arguments, or -m MODULE and its
    arguments) in this interpreter, unchanged, with its CUDA allocations that the GPU's
    memory refuses placed on TIER (dram0, cxl0, a node id) instead of failing with CUDA
    out of memory. Weights that spilled are read through HBM by copy in forward passes
    without gradients (PYCXL_SPILL_STREAM_WEIGHTS=0: in place). The exit status is the
    program's.

    \b
    pycxl spill cxl0 train.py --epochs 3
    pycxl spill --log cxl0 -m my_trainer --epochs 3
    """
    import pycxl

    if module is None and program and program[0].startswith("-m"):
        module, program = _module_after_tier(program)
    if module is None and not program:
        raise click.UsageError("give the program: a script (train.py ARGS) or -m MODULE ARGS")
    if module is None and not os.path.isfile(program[0]):
        raise click.UsageError(f"no such script: {program[0]!r} (give a Python file, or -m MODULE)")
    pycxl.spill_to(tier, log=True if log_spills else None)
    try:
        if module is not None:
            sys.argv = [module, *program]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(program)
            sys.path.insert(0, os.path.dirname(os.path.abspath(program[0])))  # as python does
            runpy.run_path(program[0], run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:  # the program's own error: as python reports it, exit 1
        traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        _summary()


def _summary() -> None:
    """What the spill did, on stderr, as the program ends (however it ends)."""
    from pycxl.torch import tier as torch_tier

    try:
        reports = torch_tier.spill_reports()
    except Exception as e:  # the program's own outcome matters more than the summary
        click.echo(f"pycxl spill: no summary ({e})", err=True)
        return
    for r in reports:
        for line in r.lines():
            click.echo(f"pycxl spill: {line}", err=True)
        if r.refused:
            fix = f"free memory on node {r.node}, or spill to a larger tier"
            click.echo(f"pycxl spill: {r.tier} could not take what HBM refused: {fix}", err=True)


def _module_after_tier(program: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """``-m MODULE ARGS`` (or ``-mMODULE ARGS``) where the script would be, as python reads
    its command line: what follows TIER is the program's, so click leaves it there."""
    first, rest = program[0], program[1:]
    if first != "-m":
        return first[2:], rest
    if not rest or not rest[0] or rest[0].startswith("-"):
        raise click.UsageError("-m needs a MODULE to run (pycxl spill TIER -m MODULE ARGS)")
    return rest[0], rest[1:]
