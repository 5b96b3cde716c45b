"""Measurements by name: the one place that decides which measurement an (initiator,
target) pair gets, for the library, the CLI and the matrix alike.

- host memory (dram0, cxl0, nodeN) from CPUs (the default: those nearest it): the CPU
  chase, STREAM, first touch;
- host memory from a GPU: the GPU's chase through a mapping (zero-copy), and its
  pinned copy of the memory (bandwidth);
- a GPU's own memory, from that GPU: its chase and STREAM; from CPUs or another GPU:
  not measured (CPUs do not load from GPU memory).

Every function resolves names against one snapshot (``system``, read here when not
given), accepts sizes as bytes or strings (``"256M"``) and returns a list of results.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequestError
from ..gpu.devices import GpuDevice
from ..system import System, snapshot, wants_gpus
from ..tiers import name_text
from ..units import parse_size
from ..values import count
from .context import default
from .results import (
    BandwidthResult,
    BenchResult,
    FirstTouchResult,
    LatencyResult,
    LoadedLatencyResult,
    OffloadResult,
    TransferResult,
    factor_apart,
)

if TYPE_CHECKING:
    from .context import Placement

Size = int | str | None
MATRIX_COPY_SIZE = 256 << 20  # a GPU's copy from a host tier, per matrix cell


def _system(system: System | None, *names: str | None) -> System:
    return system or snapshot(gpus=wants_gpus(*names))


def _size(size: Size, what: str = "size") -> int | None:
    if size is None:
        return None
    n = parse_size(size)
    if n <= 0:
        raise InvalidRequestError(f"{what} must be positive, not {size!r}")
    return n


def _samples(samples: int | None) -> None:
    if samples is not None:
        count(samples, "samples")


def _seconds(value: float | None, what: str, above: float = 0.0) -> None:
    """A duration or factor: a finite number above ``above``."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
        above < value < math.inf
    ):  # fmt: skip
        raise InvalidRequestError(f"{what} {value!r}: give a number above {above:g}")


@dataclass(frozen=True)
class _Pair:
    """An (initiator, target) pair, resolved."""

    gpu: GpuDevice | None  # the GPU that accesses, if a GPU does
    in_gpu_memory: bool  # the target is that GPU's own memory


def _pair(system: System, target: str, initiator: str | None) -> _Pair:
    if wants_gpus(target) and initiator is not None and not wants_gpus(initiator):
        raise InvalidRequestError(
            f"{initiator} cannot load from GPU memory: measure {target} from itself "
            f"(--target {target}) or host memory from it (--from {target} --target dram0)"
        )
    if wants_gpus(target, initiator):
        system.require_gpus()  # no driver or no GPU says so, before 'unknown gpu0'
    t = system.resolve(target)
    i = system.resolve(initiator, initiator=True) if initiator is not None else None
    if t.kind == "gpu":
        if i is not None and i.gpu != t.gpu:
            raise InvalidRequestError(
                f"{initiator} is not measured against another GPU's memory ({target}): "
                f"use --target {initiator}, or a host tier with --from {initiator}"
            )
        return _Pair(t.gpu, True)
    if i is not None and i.kind == "gpu":
        return _Pair(i.gpu, False)
    return _Pair(None, False)


def measure_latency(
    target: str,
    initiator: str | None = None,
    *,
    size: Size = None,
    page: str = "4k",
    samples: int | None = None,
    loads: int | None = None,
    system: System | None = None,
) -> list[LatencyResult]:
    """Idle load-to-use latency of ``target`` from ``initiator`` (pointer chase).

    CPUs (default: those nearest the target) chase host memory; a GPU chases its own
    memory (``target="gpu0"``) or host memory mapped for it (``initiator="gpu0"``).
    Default arena: 4x the last-level cache (CPU) or the L2 (GPU), at least 256 MiB.
    """
    from . import gpu_latency, latency

    _samples(samples)
    if loads is not None:
        count(loads, "loads")
    s = _system(system, target, initiator)
    pair = _pair(s, target, initiator)
    n = _size(size)
    if pair.gpu is None:
        p = s.placement(target, initiator)
        r = latency.chase_latency(p, size=n, page=page, samples=samples, loads=loads)
        adv = s.advertised(p.node, p.cpus)
        ns = adv.read_latency_ns if adv is not None else None
        apart = factor_apart(r.latency_ns_median, ns)
        return [dataclasses.replace(r, advertised_latency_ns=ns, advertised_factor=apart)]
    host = None if pair.in_gpu_memory else s.placement(target)
    return [
        gpu_latency.gpu_chase_latency(
            pair.gpu, host, size=n, page=page, samples=samples, loads=loads
        )
    ]


def latency_sweep_sizes(
    target: str, initiator: str | None = None, *, top: Size = None, system: System | None = None
) -> list[int]:
    """Working-set sizes of a latency sweep, doubling from 16 KiB: to twice the
    last-level cache for CPUs, twice the L2 for a GPU, or to ``top``."""
    from . import gpu_latency, latency

    s = _system(system, target, initiator)
    pair = _pair(s, target, initiator)
    limit = _size(top, "top")
    if pair.gpu is not None:
        return gpu_latency.gpu_sweep_sizes(pair.gpu, limit)
    return latency.sweep_sizes(limit)


def measure_bandwidth(
    target: str,
    initiator: str | None = None,
    *,
    threads: int | None = None,
    kernel: str = "all",
    size: Size = None,
    samples: int | None = None,
    nt_stores: bool = False,
    mix: str | None = None,
    system: System | None = None,
) -> list[BenchResult]:
    """Bandwidth of ``target`` from ``initiator``: STREAM by CPUs on host memory (one
    result per kernel), STREAM in a GPU's own memory (``target="gpu0"``), or the pinned
    copy from a host tier to a GPU (``initiator="gpu0"``). ``mix`` ('read', '3:1',
    '2:1', '1:1', 'nt-write', several comma-separated, or 'all'): instead of STREAM, the
    peak bandwidth of each read/write mix (MLC's peak injection bandwidth), by CPUs."""
    from . import bandwidth, gpu_stream, loaded, transfer

    _samples(samples)
    if threads is not None:
        count(threads, "threads")
    if mix is not None:
        mixes = loaded.mix_names(mix)
        if kernel != "all" or nt_stores:
            raise InvalidRequestError("--mix measures its own loads: drop --kernel and --nt-stores")
        s = _system(system, target, initiator)
        if _pair(s, target, initiator).gpu is not None:
            raise InvalidRequestError("--mix is measured by CPUs on host memory")
        p = s.placement(target, initiator)
        n_threads = threads or len(p.cpus)
        if not 1 <= n_threads <= len(p.cpus):
            raise InvalidRequestError(
                f"{n_threads} threads but initiator {p.initiator} has {len(p.cpus)} CPUs"
            )
        for m in mixes:
            loaded.check_nt(m)
        mixed = [loaded.mix_bandwidth(p, p.cpus[:n_threads], m, size=_size(size),
                                      samples=samples) for m in mixes]  # fmt: skip
        return [_advertised_bandwidth(s, p, r) for r in mixed]
    if threads is not None and threads < 1:
        raise InvalidRequestError(f"threads must be at least 1, not {threads}")
    s = _system(system, target, initiator)
    pair = _pair(s, target, initiator)
    n = _size(size)
    if pair.gpu is None:
        p = s.placement(target, initiator)
        out: list[BandwidthResult] = bandwidth.stream_bandwidth(
            p, threads=threads, kernel=kernel, size=n, nt_stores=nt_stores, samples=samples
        )
        return [_advertised_bandwidth(s, p, r) for r in out]
    if threads is not None or nt_stores:
        raise InvalidRequestError("--threads and --nt-stores apply to CPU initiators")
    if pair.in_gpu_memory:
        return list(gpu_stream.gpu_stream_bandwidth(pair.gpu, kernel=kernel, size=n,
                                                    samples=samples))  # fmt: skip
    if kernel not in ("all", "copy"):
        raise InvalidRequestError(
            f"a GPU reads host memory by copying it (kernel copy), not with '{kernel}'"
        )
    return list(transfer.copy_bandwidth([pair.gpu], s.placement(target), direction="h2d",
                                        size=n, samples=samples))  # fmt: skip


def _advertised_bandwidth(s: System, p: Placement, r: BandwidthResult) -> BandwidthResult:
    """The result with the platform's read bandwidth for its CPUs beside it."""
    adv = s.advertised(p.node, r.cpus or p.cpus)
    bw = adv.read_bytes_per_s if adv is not None else None
    return dataclasses.replace(r, advertised_bytes_per_s=bw,
                               advertised_factor=factor_apart(r.bytes_per_s, bw))  # fmt: skip


def measure_first_touch(
    target: str,
    initiator: str | None = None,
    *,
    size: Size = None,
    page: str = "4k",
    system: System | None = None,
) -> list[FirstTouchResult]:
    """Per-page cost of the first write to fresh memory on ``target`` (CPUs only;
    default 64 MiB)."""
    from . import first_touch

    s = _system(system, target, initiator)
    if _pair(s, target, initiator).gpu is not None:
        raise InvalidRequestError("first touch is measured from CPUs, on host memory")
    p = s.placement(target, initiator)
    return [first_touch.first_touch(p, size=_size(size), page=page)]


def measure_transfer(
    gpu: str,
    target: str,
    *,
    direction: str = "both",
    size: Size = None,
    memory: str = "pinned",
    samples: int | None = None,
    system: System | None = None,
) -> list[TransferResult]:
    """Copy bandwidth between ``gpu`` (gpuN, or ``all`` at once) and host memory on
    ``target``. ``direction``: h2d, d2h, both (one after the other) or bidir (at once);
    ``memory``: pinned, pageable (the driver's copy) or staged (pycxl's pipelined copy).
    Default size 1 GiB. One result per phase."""
    from ..gpu.staged import MAX_THREADS
    from . import transfer

    _samples(samples)
    every = name_text(gpu, "GPU") == "all"
    transfer.check_transfer(direction, memory, 2 if every else 1)
    s = system or snapshot()
    gpus = s.gpus_named(gpu)
    p = s.placement(target)
    cpus = {g.index: s.copy_cpus(g, MAX_THREADS) or None for g in gpus}
    return transfer.copy_bandwidth(
        gpus, p, direction=direction, size=_size(size), memory=memory, samples=samples,
        copy_cpus={k: v for k, v in cpus.items() if v}, every_gpu=every,
    )  # fmt: skip


def measure_offload(
    target: str = "all",
    gpu: str = "gpu0",
    *,
    modes: Sequence[str] | str = "hbm,pycxl,to,pinned",
    layers: int | None = None,
    width: int | None = None,
    tokens: int | None = None,
    lookahead: int = 1,
    backward: bool = False,
    samples: int | None = None,
    system: System | None = None,
) -> list[OffloadResult]:
    """A stack of ``layers`` bf16 Linear(``width``, ``width``) layers over ``tokens`` rows,
    run on ``gpu`` with its weights in HBM (mode ``hbm``, always run: the bound's compute
    time) and on each host tier of ``target`` (``all``: every node with memory; or names:
    ``dram0,cxl0``): streamed by pycxl, ``.to()`` from pageable memory, pinned copies
    without look-ahead. Defaults: 16 layers of 8192 (2 GiB of weights), 1024 tokens.
    ``gpu="all"``: every GPU alone, then all of them streaming from each tier at once
    (pycxl's mode), each result with its step alone (``alone_s``)."""
    from . import offload

    s = system or snapshot()
    gpus = s.gpus_named(gpu)
    tiers = [s.tier(n) for n in s.memory_nodes(target)]
    placements = [s.placement(t.name) for t in tiers if t is not None]
    wanted = [m.strip() for m in modes.split(",")] if isinstance(modes, str) else list(modes)
    shape: dict[str, Any] = dict(
        layers=layers or offload.LAYERS, width=width or offload.WIDTH,
        tokens=tokens or offload.TOKENS, lookahead=lookahead, backward=backward, samples=samples,
    )  # fmt: skip
    if gpu.strip().lower() == "all":
        return offload.offload_together(gpus, placements, **shape)
    return offload.offload_steps(gpus[0], placements, modes=wanted, **shape)


def measure_loaded_latency(
    target: str,
    initiator: str | None = None,
    *,
    load_on: str | None = None,
    load_from: str | None = None,
    mix: str = "read",
    rates: Sequence[float] | None = None,
    fractions: Sequence[float] | None = None,
    steps: int | None = None,
    size: Size = None,
    load_size: Size = None,
    load_threads: int | None = None,
    seconds: float | None = None,
    knee: float | None = None,
    system: System | None = None,
) -> list[LoadedLatencyResult]:
    """Latency of ``target`` from ``initiator`` while a load runs on ``load_on`` (default:
    the target), one curve per mix (``mix``: one, several comma-separated, or 'all').

    The chase runs on the initiator's first CPU (default: the CPUs nearest the target),
    or on a GPU (``initiator="gpu0"``: its zero-copy chase). The load comes from the
    initiator's other CPUs (not the chase CPU's core; for a GPU chaser, the CPUs nearest
    the load tier), ``load_threads`` of them (default: all), or from a GPU's copy
    engines (``load_from="gpu0"``). ``rates`` in bytes/s, ``fractions`` of the load's
    unpaced peak, or a sweep of ``steps`` points from idle to the peak."""
    from . import loaded
    from .context import smt_siblings

    mixes = loaded.mix_names(mix)
    if steps is not None:
        count(steps, "steps (a sweep needs at least 2)", 2)
    if load_threads is not None:
        count(load_threads, "load threads")
    _seconds(seconds, "seconds per point")
    _seconds(knee, "knee factor", 1.0)
    if rates is not None:
        if isinstance(rates, str) or not rates:
            raise InvalidRequestError(f"rates {rates!r}: give bandwidths in bytes/s, above 0")
        for r in rates:
            _seconds(r, "rate (bytes/s)")
    if fractions is not None and (isinstance(fractions, str) or any(
        isinstance(f, bool) or not isinstance(f, numbers.Real) or not 0 < f <= 1
        for f in fractions
    )):  # fmt: skip
        raise InvalidRequestError("fractions of the peak are above 0 and at most 1")
    s = _system(system, target, initiator, load_from)
    load_target = load_on or target
    for name in (target, load_target):
        if wants_gpus(name):
            raise InvalidRequestError(
                f"{name} is GPU memory: loaded latency measures host tiers (the GPU's own "
                "memory is measured by pycxl bench latency/bandwidth --target gpuN)"
            )
    pair = _pair(s, target, initiator)
    load_gpu = None
    if load_from is not None:
        if not wants_gpus(load_from):
            raise InvalidRequestError(
                "--load-from takes a GPU (gpu0); CPU loads come from the initiator's CPUs"
            )
        s.require_gpus()
        (load_gpu,) = s.gpus_named(load_from)
        if load_threads is not None:
            raise InvalidRequestError("--load-threads applies to CPU loads, not a GPU's")
        for m in mixes:
            if m not in loaded.GPU_MIXES:
                raise InvalidRequestError(
                    f"a GPU load copies host memory: mix read (host to GPU), nt-write (GPU "
                    f"to host) or 1:1 (both at once), not {m}"
                )
    if pair.gpu is not None:  # a GPU chases; CPUs near the load tier (or a GPU) load it
        chase = s.placement(target)
        lp = s.placement(load_target)
        free_cpus = list(lp.cpus)
    else:
        chase = s.placement(target, initiator)
        lp = s.placement(load_target, initiator)
        busy = set(smt_siblings(chase.cpus[0])) | {chase.cpus[0]}
        free_cpus = [c for c in lp.cpus if c not in busy]
    cpus: list[int] = free_cpus[:4]  # a GPU load's copy threads: off the chase's core
    if load_gpu is None:
        n = load_threads if load_threads is not None else len(free_cpus)
        if n < 1 or n > len(free_cpus):
            raise InvalidRequestError(
                f"{n} load threads, but {len(free_cpus)} CPUs of {lp.initiator} are left "
                f"for load threads (the chase runs on cpu{chase.cpus[0]} and its core is "
                "kept free)"
                if free_cpus
                else f"no CPU of {lp.initiator} is left for load threads besides the chase's"
            )
        cpus = free_cpus[:n]
        for m in mixes:
            loaded.check_nt(m)
    gpu_chaser = None
    results = []
    try:
        if pair.gpu is not None:
            from .gpu_latency import GpuChaser

            gpu_chaser = GpuChaser(pair.gpu, chase.node, _size(size))
        for m in mixes:
            results.append(loaded.loaded_latency(
                chase, lp, cpus, mix=m, rates=rates, fractions=fractions, steps=steps,
                size=_size(size), load_size=_size(load_size, "load size"), seconds=seconds,
                knee_factor=knee or loaded.KNEE, gpu=load_gpu, gpu_chaser=gpu_chaser,
            ))  # fmt: skip
    finally:
        if gpu_chaser is not None:
            gpu_chaser.close()
    return results


# --- the initiator x target matrix ------------------------------------------------------
@dataclass(frozen=True)
class MatrixCell:
    """One measured cell: ``kind`` is 'latency' or 'bandwidth'."""

    initiator: str
    target: str
    kind: str
    result: BenchResult

    def as_json(self) -> dict[str, Any]:
        """The result's JSON with the cell's kind under 'matrix'."""
        return {"matrix": self.kind, **self.result.as_json()}


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
    system: System | None = None,
    progress: Callable[[Sequence[tuple[str, str]]], Any] | None = None,
) -> Matrix:
    """Latency and/or bandwidth (triad; a GPU's pinned copy from host tiers) of every
    pair; ``loaded``: also, for CPU initiators, the latency while the initiator's other
    CPUs read the target at 50% and 90% of their peak. ``progress``, given the pairs,
    returns what to iterate (a progress bar)."""
    s = system or snapshot()
    inits, targets, pairs = matrix_pairs(s)
    n = _size(size)
    cells: list[MatrixCell] = []
    for i, t in progress(pairs) if progress else pairs:
        initiator = None if i == t else i  # a GPU's own memory is measured from itself
        if latency:
            (r,) = measure_latency(t, initiator, size=n, samples=default(3, 2), system=s)
            cells.append(MatrixCell(i, t, "latency", r))
        if bandwidth:
            copy = wants_gpus(i) and not wants_gpus(t)  # a GPU reads host memory by copying
            rs = measure_bandwidth(
                t, initiator, kernel="copy" if copy else "triad",
                size=n or (default(MATRIX_COPY_SIZE, 16 << 20) if copy else None),
                samples=default(4, 2), system=s,
            )  # fmt: skip
            cells += [MatrixCell(i, t, "bandwidth", r) for r in rs]
        if loaded and not wants_gpus(i, t):
            (lr,) = measure_loaded_latency(
                t, initiator, fractions=LOADED_FRACTIONS, size=n,
                seconds=default(500, 200) / 1e3, system=s,
            )  # fmt: skip
            cells.append(MatrixCell(i, t, "loaded", lr))
    return Matrix(tuple(inits), tuple(targets), tuple(cells))
