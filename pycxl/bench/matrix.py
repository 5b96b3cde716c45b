"""The initiator x target matrix, as MLC's idle-latency and bandwidth matrices, with
GPUs: every pair that can be measured, each measured as ``dispatch`` measures that pair
by name."""

from __future__ import annotations

from dataclasses import dataclass

from ..base.errors import InvalidRequestError
from ..base.jsontype import Json
from ..base.values import instance
from ..measure.conditions import default
from ..measure.results import BenchResult, bench_result_json
from ..resolve.system import System
from .dispatch import (
    Progress,
    Size,
    _bandwidth,
    _chase_size,
    _each,
    _latency,
    _live,
    _loaded,
    _size,
)

MATRIX_COPY_SIZE = 256 << 20  # a GPU's copy from a host tier, per matrix cell


@dataclass(frozen=True)
class MatrixCell:
    """One measured cell: ``kind`` is 'latency' or 'bandwidth'."""

    initiator: str
    target: str
    kind: str
    result: BenchResult


@dataclass(frozen=True)
class Matrix:
    """MLC's idle-latency and bandwidth matrices, with GPUs: rows are initiators (nodes
    with CPUs, GPUs), columns are targets (nodes with memory, each GPU's memory)."""

    initiators: tuple[str, ...]
    targets: tuple[str, ...]
    cells: tuple[MatrixCell, ...]

    def cell(self, initiator: str, target: str, kind: str) -> MatrixCell | None:
        """The cell measured for this pair, if any (CPUs x GPU memory is never measured)."""
        return next(
            (c for c in self.cells if (c.initiator, c.target, c.kind) == (initiator, target, kind)),
            None,
        )


def matrix_pairs(system: System) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """(initiators, targets, the pairs that can be measured)."""
    instance(system, System, "system", "a System (pycxl.snapshot())")
    gpus = [g.target_name for g in system.gpus.devices]
    cpu_inits = [n.name for n in system.nodes if n.node.cpus]
    host_targets = [n.name for n in system.nodes if n.node.has_memory]
    pairs = [(i, t) for i in cpu_inits for t in host_targets]
    pairs += [(g, t) for g in gpus for t in [*host_targets, g]]
    return cpu_inits + gpus, host_targets + gpus, pairs


LOADED_FRACTIONS = (0.5, 0.9)  # the matrix's loaded latency: at these fractions of the peak


def measure_matrix(
    *,
    latency: bool = True,
    bandwidth: bool = False,
    loaded: bool = False,
    size: Size = None,
    gpus: bool = True,
    system: System | None = None,
    progress: Progress | None = None,
) -> Matrix:
    """Latency and/or bandwidth (triad; a GPU's pinned copy from host tiers) of every
    pair; ``loaded``: also, for CPU initiators, the latency while the initiator's other
    CPUs read the target at 50% and 90% of their peak; ``gpus``: GPUs as initiators and
    targets (when the snapshot is read here). ``progress``, given the pairs, returns
    what to iterate (a progress bar)."""
    if not (latency or bandwidth or loaded):
        raise InvalidRequestError(
            "latency, bandwidth and loaded are all off: the matrix has nothing to measure"
        )
    s = _live(system, gpus=gpus)
    inits, targets, names = matrix_pairs(s)
    gpu_inits = {g.target_name for g in s.gpus.devices}
    # a GPU's latency cell and a loaded cell (a CPU's) chase an arena of at least
    # CHASE_MIN_SIZE, checked here once; a CPU's latency cell takes the size as given
    chases = any(latency if i in gpu_inits else loaded for i, _ in names)
    n = _chase_size(size) if chases else _size(size)
    cells: list[MatrixCell] = []
    for i, t in _each(names, progress):
        pair = s.pair(t, None if i == t else i)  # a GPU's own memory, from itself
        if latency:
            r = _latency(s, pair, n, "4k", default(3, 2), None)
            cells.append(MatrixCell(i, t, "latency", r))
        if bandwidth:
            copy = pair.gpu is not None and not pair.in_gpu_memory  # a GPU copies host memory
            rs = _bandwidth(s, pair, None, "copy" if copy else "triad",
                            n or (default(MATRIX_COPY_SIZE, 16 << 20) if copy else None),
                            default(4, 2), False)  # fmt: skip
            cells += [MatrixCell(i, t, "bandwidth", r) for r in rs]
        if loaded and pair.gpu is None:
            (lr,) = _loaded(pair, pair, ["read"], (), None, rates=None,
                            fractions=LOADED_FRACTIONS, steps=None, size=n, load_size=None,
                            seconds=default(500, 200) / 1e3, knee=None)  # fmt: skip
            cells.append(MatrixCell(i, t, "loaded", lr))
    return Matrix(tuple(inits), tuple(targets), tuple(cells))


def matrix_cell_json(c: MatrixCell) -> Json:
    """A matrix cell: its result's JSON with the cell's kind under 'matrix'."""
    return {"matrix": c.kind, **bench_result_json(c.result)}
