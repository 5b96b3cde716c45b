"""Measurements by name: the one place that decides which measurement an (initiator,
target) pair gets, for the library, the CLI and the matrix alike, and how a sweep runs.

- host memory (dram0, cxl0, nodeN) from CPUs (the default: those nearest it): the CPU
  chase, STREAM, first touch;
- host memory from a GPU: the GPU's chase through a mapping (zero-copy), and its
  pinned copy of the memory (bandwidth);
- a GPU's own memory, from that GPU: its chase and STREAM; from CPUs or another GPU:
  not measured (CPUs do not load from GPU memory).

Every function resolves each name once, against one snapshot (``system``, read here
when not given), into a ``pycxl.measure.targets.Pair`` that says what it is; accepts sizes as
bytes or strings (``"256M"``) and returns a list of results. Sweeps (``sweep=True``,
several ``threads``) take a ``progress`` callable, given the points, that returns what
to iterate (a progress bar).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar

from ..base.errors import InvalidRequestError
from ..base.values import (
    CHASE_MIN_SIZE,
    MAX_LOADS,
    MAX_RATE_GBS,
    MAX_STEPS,
    count,
    finite,
    flag,
    optional_size,
    page_size,
    reals,
    samples as checked_samples,
    size as checked_size,
    word_list,
)
from ..gpu.inventory import GpuDevice
from ..measure.conditions import default
from ..measure.results import (
    BandwidthResult,
    BenchResult,
    FirstTouchResult,
    LatencyResult,
    LoadedLatencyResult,
    OffloadResult,
    TransferResult,
    factor_apart,
)
from ..measure.targets import Pair
from ..resolve.system import System, given_or_read
from ..resolve.tiers import gpu_name, name_text, split_names

Size = int | str | None
T = TypeVar("T")
Progress = Callable[[Sequence[Any]], Iterable[Any]]


def _system(system: System | None) -> System:
    return _live(system, gpus="lazy")  # a GPU name reads the GPUs when it is resolved


def _live(system: System | None, *, gpus: bool | Literal["lazy"] = True) -> System:
    """The system to measure on: this machine's (a recorded tree's names would measure
    this machine's nodes under another's names)."""
    s = given_or_read(system, gpus=gpus)
    s.require_live("measuring")
    return s


def _loads(loads: int) -> None:
    """The chase runs its loads 16 at a time: another count would be rounded unsaid."""
    count(loads, "loads", 16, MAX_LOADS)
    if loads % 16:
        raise InvalidRequestError(
            f"loads {loads}: give a multiple of 16 (the chase runs 16 loads a step), such as "
            f"{loads - loads % 16 or 16}"
        )


def _size(size: Size, what: str = "size") -> int | None:
    return optional_size(size, what)


def _chase_size(size: Size) -> int | None:
    """A chase arena's size: read as any size, then held to the chase's least
    (``CHASE_MIN_SIZE``); the chases below take it as checked."""
    n = _size(size)
    return None if n is None else checked_size(n, "chase size", CHASE_MIN_SIZE)


def _seconds(value: float | None, what: str, above: float = 0.0) -> None:
    """A duration or factor: a finite number above ``above`` (values.finite decides)."""
    if value is not None:
        finite(value, what, above)


def _each(points: Sequence[T], progress: Progress | None) -> Iterable[T]:
    if progress is not None and not callable(progress):
        raise InvalidRequestError(f"progress {progress!r}: give a callable (a bar) or None")
    return progress(points) if progress is not None else points


# --- latency -----------------------------------------------------------------------------
def measure_latency(
    target: str,
    initiator: str | None = None,
    *,
    size: Size = None,
    page: str = "4k",
    samples: int | None = None,
    loads: int | None = None,
    sweep: bool = False,
    system: System | None = None,
    progress: Progress | None = None,
) -> list[LatencyResult]:
    """Idle load-to-use latency of ``target`` from ``initiator`` (pointer chase).

    CPUs (default: those nearest the target) chase host memory; a GPU chases its own
    memory (``target="gpu0"``) or host memory mapped for it (``initiator="gpu0"``).
    Default arena: 4x the last-level cache (CPU) or the L2 (GPU), at least 256 MiB.
    ``sweep``: one result per working set, doubling from 16 KiB to twice that cache
    (or to ``size``), each with fewer samples and loads.
    """
    # each value checked here, once; the chase below trusts them
    samples = checked_samples(samples)
    if loads is not None:
        _loads(loads)
    n = optional_size(size, "size", CHASE_MIN_SIZE)
    page = page_size(page)
    s = _system(system)
    pair = s.pair(target, initiator)
    if not sweep:
        return [_latency(s, pair, n, page, samples, loads)]
    gpu = pair.gpu is not None
    per_point = loads or default(1 << 16 if gpu else 1 << 20, 1 << 14)
    return [_latency(s, pair, point, page, samples or default(3, 2), per_point)
            for point in _each(_sweep_sizes(pair, n), progress)]  # fmt: skip


def _latency(s: System, pair: Pair, size: int | None, page: str, samples: int | None,
             loads: int | None) -> LatencyResult:  # fmt: skip
    from ..measure import gpu_latency, latency

    if pair.gpu is not None:
        return gpu_latency.gpu_chase_latency(pair, size=size, page=page, samples=samples,
                                             loads=loads)  # fmt: skip
    r = latency.chase_latency(pair, size=size, page=page, samples=samples, loads=loads)
    adv = s.advertised(pair.node, pair.cpus)
    ns = adv.read_latency_ns if adv is not None else None
    apart = factor_apart(r.latency_ns_median, ns)
    return dataclasses.replace(r, advertised_latency_ns=ns, advertised_factor=apart)


def latency_sweep_sizes(
    target: str, initiator: str | None = None, *, top: Size = None, system: System | None = None
) -> list[int]:
    """Working-set sizes of a latency sweep, doubling from 16 KiB: to twice the
    last-level cache for CPUs, twice the L2 for a GPU, or to ``top``."""
    s = _system(system)
    return _sweep_sizes(s.pair(target, initiator), _size(top, "top"))


def _sweep_sizes(pair: Pair, top: int | None) -> list[int]:
    from ..measure import gpu_latency, latency

    if pair.gpu is not None:
        return gpu_latency.gpu_sweep_sizes(pair.gpu, top)
    return latency.sweep_sizes(top)


# --- bandwidth ---------------------------------------------------------------------------
def measure_bandwidth(
    target: str,
    initiator: str | None = None,
    *,
    threads: int | Sequence[int] | None = None,
    kernel: str = "all",
    size: Size = None,
    samples: int | None = None,
    nt_stores: bool = False,
    mix: str | None = None,
    zero_copy: bool = False,
    system: System | None = None,
    progress: Progress | None = None,
) -> list[BenchResult]:
    """Bandwidth of ``target`` from ``initiator``: STREAM by CPUs on host memory (one
    result per kernel), STREAM in a GPU's own memory (``target="gpu0"``), or the pinned
    copy from a host tier to a GPU (``initiator="gpu0"``); with ``zero_copy``, STREAM run
    by the GPU on arrays on the host tier itself, read and written in place. ``mix`` ('read', '3:1',
    '2:1', '1:1', 'nt-write', several comma-separated, or 'all'): instead of STREAM, the
    peak bandwidth of each read/write mix (MLC's peak injection bandwidth), by CPUs.
    ``threads``: CPU threads (default: every CPU of the initiator); several
    (``[1, 2, 4]``) sweep, each count's results in turn."""
    from ..measure import loaded

    samples = checked_samples(samples)
    counts: list[int | None]
    if threads is None:
        counts = [None]
    elif isinstance(threads, numbers.Integral) and not isinstance(threads, bool):
        counts = [int(threads)]
    elif isinstance(threads, Sequence) and not isinstance(threads, str) and threads:
        counts = list(threads)
    else:
        raise InvalidRequestError(
            f"threads {threads!r}: give a whole number of at least 1, or a list of them"
        )
    for t in counts:
        if t is not None:
            count(t, "threads")
    mixes = loaded.mix_names(mix) if mix is not None else None
    if mixes is not None and (kernel != "all" or nt_stores):
        raise InvalidRequestError("--mix measures its own loads: drop --kernel and --nt-stores")
    flag(zero_copy, "zero_copy")
    if zero_copy and (mixes is not None or threads is not None or nt_stores):
        raise InvalidRequestError(
            "--zero-copy is a GPU's STREAM on the tier: drop --mix, --threads and --nt-stores"
        )
    s = _system(system)
    pair = s.pair(target, initiator)
    if zero_copy:
        return _zero_copy_bandwidth(s, pair, kernel, _size(size), samples)
    n = _size(size)
    out: list[BenchResult] = []
    for t in _each(counts, progress if len(counts) > 1 else None):
        if mixes is not None:
            out += _mix_bandwidth(s, pair, t, mixes, n, samples)
        else:
            out += _bandwidth(s, pair, t, kernel, n, samples, nt_stores)
    return out


def _bandwidth(s: System, pair: Pair, threads: int | None, kernel: str, size: int | None,
               samples: int | None, nt_stores: bool) -> list[BenchResult]:  # fmt: skip
    from ..measure import bandwidth, gpu_stream, transfer

    if pair.gpu is None:
        out = bandwidth.stream_bandwidth(pair, threads=threads, kernel=kernel, size=size,
                                         nt_stores=nt_stores, samples=samples)  # fmt: skip
        return [_advertised_bandwidth(s, pair, r) for r in out]
    if threads is not None or nt_stores:
        raise InvalidRequestError("--threads and --nt-stores apply to CPU initiators")
    if pair.in_gpu_memory:
        return list(gpu_stream.gpu_stream_bandwidth(pair.gpu, kernel=kernel, size=size,
                                                    samples=samples))  # fmt: skip
    if kernel not in ("all", "copy"):
        raise InvalidRequestError(
            f"a GPU reads host memory by copying it (kernel copy), not with '{kernel}'"
        )
    return list(transfer.copy_bandwidth([pair.gpu], pair, direction="h2d", size=size,
                                        samples=samples))  # fmt: skip


def _zero_copy_bandwidth(s: System, pair: Pair, kernel: str, size: int | None,
                         samples: int | None) -> list[BenchResult]:  # fmt: skip
    from ..gpu.tier_pool import open_pool
    from ..measure import gpu_stream

    if pair.gpu is None or pair.in_gpu_memory:
        raise InvalidRequestError(
            "--zero-copy runs a GPU's kernels on host memory: give a GPU as --from and a "
            "host tier as --target (-t cxl0 --from gpu0)"
        )
    n = size or gpu_stream.DEFAULT_SIZE
    pair.check_fits(3 * n)  # three arrays on the tier
    tier = s.tier(pair.node)
    pool = open_pool(pair.node, tier.name if tier is not None else f"node{pair.node}")
    return list(gpu_stream.tier_stream_bandwidth(pair.gpu, pool, kernel=kernel, size=size,
                                                 samples=samples))  # fmt: skip


def _mix_bandwidth(s: System, pair: Pair, threads: int | None, mixes: list[str],
                   size: int | None, samples: int | None) -> list[BenchResult]:  # fmt: skip
    from ..measure import loaded

    if pair.gpu is not None:
        raise InvalidRequestError("--mix is measured by CPUs on host memory")
    n_threads = threads or len(pair.cpus)
    if not 1 <= n_threads <= len(pair.cpus):
        raise InvalidRequestError(
            f"{n_threads} threads but initiator {pair.initiator.name} has {len(pair.cpus)} CPUs"
        )
    for m in mixes:
        loaded.check_nt(m)
    return [_advertised_bandwidth(s, pair, loaded.mix_bandwidth(
        pair, pair.cpus[:n_threads], m, size=size, samples=samples)) for m in mixes]  # fmt: skip


def _advertised_bandwidth(s: System, p: Pair, r: BandwidthResult) -> BandwidthResult:
    """The result with the platform's read bandwidth for its CPUs beside it."""
    adv = s.advertised(p.node, r.cpus or p.cpus)
    bw = adv.read_bytes_per_s if adv is not None else None
    return dataclasses.replace(r, advertised_bytes_per_s=bw,
                               advertised_factor=factor_apart(r.bytes_per_s, bw))  # fmt: skip


# --- first touch -------------------------------------------------------------------------
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
    from ..measure import first_touch

    page = page_size(page)
    pair = _system(system).pair(target, initiator)
    if pair.gpu is not None:
        raise InvalidRequestError("first touch is measured from CPUs, on host memory")
    return [first_touch.first_touch(pair, size=_size(size), page=page)]


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
    from ..measure import transfer

    samples = checked_samples(samples)
    every = gpu_name(gpu) == "all"
    transfer.check_transfer(direction, memory, 2 if every else 1)
    s = _live(system)
    gpus = s.gpus_named(gpu)
    p = s.pair(target)
    cpus = {g.index: s.copy_cpus(g, MAX_THREADS) or None for g in gpus}
    return transfer.copy_bandwidth(
        gpus, p, direction=direction, size=_size(size), memory=memory, samples=samples,
        copy_cpus={k: v for k, v in cpus.items() if v}, every_gpu=every,
    )  # fmt: skip


def measure_offload(
    target: str = "all",
    gpu: str = "gpu0",
    *,
    modes: Sequence[str] | str | None = None,
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
    without look-ahead, and with ``backward`` the optimizer step with its state on the
    tier (``update``); ``modes`` None runs them all. Defaults: 16 layers of 8192 (2 GiB
    of weights), 1024 tokens.
    ``gpu="all"``: every GPU alone, then all of them streaming from each tier at once
    (pycxl's mode), each result with its step alone (``alone_s``)."""
    from ..measure import offload

    gpu_name(gpu)
    split_names(target)  # an empty list of tiers is refused before the driver, too
    if modes is None:
        wanted = list(offload.default_modes(backward))
    elif isinstance(modes, str):
        wanted = word_list(modes, "mode", offload.MODES)
    elif isinstance(modes, Sequence) and all(isinstance(m, str) for m in modes):
        wanted = list(modes)
    else:
        raise InvalidRequestError(f"modes {modes!r}: give names such as 'hbm,pycxl'")
    shape: dict[str, Any] = dict(  # None: the default; 0 is a value, and refused
        layers=offload.LAYERS if layers is None else layers,
        width=offload.WIDTH if width is None else width,
        tokens=offload.TOKENS if tokens is None else tokens,
        lookahead=lookahead, backward=backward, samples=samples,
    )  # fmt: skip
    # before the driver
    offload.check_offload(wanted, shape["layers"], shape["width"], shape["tokens"], lookahead,
                          1 if samples is None else samples, backward)  # fmt: skip
    if gpu_name(gpu) == "all" and modes is not None and set(wanted) != set(offload.STREAMING):
        raise InvalidRequestError(
            "every GPU at once (gpu all) runs pycxl's streaming mode against HBM: leave the "
            "modes out, or name one GPU to choose them"
        )
    s = _live(system)
    gpus = s.gpus_named(gpu)
    tiers = [s.tier(n) for n in s.memory_nodes(target)]
    pairs = [s.pair(t.name) for t in tiers if t is not None]
    if gpu_name(gpu) == "all":
        return offload.offload_together(gpus, pairs, **shape)
    return offload.offload_steps(gpus[0], pairs, modes=wanted, **shape)


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
    engines (``load_from="gpu0"``; ``"all"``: every GPU's at once). ``rates`` in
    bytes/s, ``fractions`` of the load's unpaced peak, or a sweep of ``steps`` points from
    idle to the peak."""
    from ..measure import loaded

    mixes = loaded.mix_names(mix)
    paced = [what for what, v in (("rates", rates), ("fractions", fractions), ("steps", steps))
             if v is not None]  # fmt: skip
    if len(paced) > 1:  # names only those given (the command line has no fractions)
        raise InvalidRequestError(
            f"give one of {', '.join(paced)}, not {' and '.join(paced)}: each says which load "
            "points are measured"
        )
    if steps is not None:
        count(steps, "steps (a sweep needs at least 2)", 2, MAX_STEPS)
    if load_threads is not None:
        count(load_threads, "load threads")
    _seconds(seconds, "seconds per point")
    _seconds(knee, "knee factor", 1.0)
    if rates is not None:
        # finite, and bounded far above any memory's bandwidth
        for r in reals(rates, "rates (bytes/s)"):
            finite(r, "rate (bytes/s)", at_most=MAX_RATE_GBS * 1e9)
    if fractions is not None and not all(0 < f <= 1 for f in reals(fractions, "fractions")):
        raise InvalidRequestError("fractions of the peak are above 0 and at most 1")
    if load_on is not None:
        name_text(load_on, "load tier")  # an empty one is refused, not read as the target
    if load_from is not None:  # what a GPU load cannot do, before its driver is asked
        gpu_name(load_from)
        if load_threads is not None:
            raise InvalidRequestError("--load-threads applies to CPU loads, not a GPU's")
        for m in mixes:
            if m not in loaded.GPU_MIXES:
                raise InvalidRequestError(
                    f"a GPU load copies host memory: mix read (host to GPU), nt-write (GPU "
                    f"to host) or 1:1 (both at once), not {m}"
                )
    # --load-from ('all' too) reads the GPUs when it is resolved, below
    s = _live(system, gpus="lazy")
    instead = ("loaded latency measures host tiers (the GPU's own memory is measured by "
               "pycxl bench latency/bandwidth --target gpuN)")  # fmt: skip
    chase = s.host_pair(target, initiator, instead=instead)
    load_on_pair = s.host_pair(load_on, initiator, instead=instead) if load_on else chase
    load_gpus: tuple[GpuDevice, ...] = ()
    if load_from is not None:
        load_gpus = s.gpus_named(load_from)
    return _loaded(chase, load_on_pair, mixes, load_gpus, load_threads, rates=rates,
                   fractions=fractions, steps=steps, size=_chase_size(size),
                   load_size=_size(load_size, "load size"), seconds=seconds, knee=knee)  # fmt: skip


def _loaded(chase: Pair, load_on: Pair, mixes: list[str], load_gpus: tuple[GpuDevice, ...],
            load_threads: int | None, **curve: Any) -> list[LoadedLatencyResult]:  # fmt: skip
    """One loaded-latency curve per mix: ``chase`` (host memory) from its CPUs' first (or
    its GPU), the load on ``load_on`` from the other CPUs (or from ``load_gpus``)."""
    from ..measure import loaded
    from ..measure.conditions import smt_siblings

    if chase.gpu is not None:  # a GPU chases; CPUs near the load tier (or a GPU) load it
        free_cpus = list(load_on.cpus)
    else:
        busy = set(smt_siblings(chase.cpus[0])) | {chase.cpus[0]}
        free_cpus = [c for c in load_on.cpus if c not in busy]
    cpus: list[int] = free_cpus[:4]  # a GPU load's copy threads: off the chase's core
    if not load_gpus:
        n = load_threads if load_threads is not None else len(free_cpus)
        who = load_on.initiator.name
        if n < 1 or n > len(free_cpus):
            raise InvalidRequestError(
                f"{n} load threads, but {len(free_cpus)} CPUs of {who} are left for load "
                f"threads (the chase runs on cpu{chase.cpus[0]} and its core is kept free)"
                if free_cpus
                else f"no CPU of {who} is left for load threads besides the chase's"
            )
        cpus = free_cpus[:n]
        for m in mixes:
            loaded.check_nt(m)
    gpu_chaser = None
    results = []
    try:
        if chase.gpu is not None:
            from ..measure.gpu_latency import GpuChaser

            gpu_chaser = GpuChaser(chase.gpu, chase.node, curve["size"])
        for m in mixes:
            results.append(loaded.loaded_latency(
                chase, load_on, cpus, mix=m, rates=curve["rates"], fractions=curve["fractions"],
                steps=curve["steps"], size=curve["size"], load_size=curve["load_size"],
                seconds=curve["seconds"], knee_factor=curve["knee"] or loaded.KNEE,
                gpus=load_gpus, gpu_chaser=gpu_chaser,
            ))  # fmt: skip
    finally:
        if gpu_chaser is not None:
            gpu_chaser.close()
    return results
