"""Latency under load: one pointer chase measures while load generators move memory at a
series of bandwidths (native/loaded.c).

Load generators are CPU threads (five read/write mixes, each paced by its own thread to
a share of the requested bandwidth) or a GPU's copy engines streaming a pinned host
buffer. The chase is the idle-latency chase (same arena, stride and TLB groups) timed in
windows of 64 dependent loads, so each point reports the mean latency and the p50 and
p99 of the windows; a GPU can be the chaser too (its zero-copy chase, one launch per
window). Each point: the load starts, settles, then the chase runs for ``duration``
while the bytes the load moves are counted over exactly that time.

A sweep first runs the load unpaced, twice (the better run is the peak it reaches with
the chase running), then paced points at fractions of that peak, then the idle point;
a point whose load fell short of its target says so (``reached``) instead of reporting
the target.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..base._lib import compiled
from ..base.errors import InvalidRequestError, NotAvailableError, OperationError
from ..base.values import word_list
from ..numa.placement import NumaBuffer
from ..numa.policy import Policy
from .conditions import cache_fit, default, huge_pages, last_level_cache, page_size
from .latency import STRIDE, TLB_PAGES, default_size as chase_default_size
from .results import BandwidthResult, LoadedLatencyResult, LoadedPoint
from .targets import Pair

MIXES = ("read", "3:1", "2:1", "1:1", "nt-write")
# reads : writes the memory sees (a plain store reads its line first)
READS_WRITES = {"read": (1, 0), "3:1": (3, 1), "2:1": (2, 1), "1:1": (1, 1), "nt-write": (0, 1)}
NT_MIXES = ("1:1", "nt-write")
# what a GPU's copy engines do for a mix: read host memory (h2d), write it (d2h), both
GPU_MIXES = {"read": ("h2d",), "nt-write": ("d2h",), "1:1": ("h2d", "d2h")}
STEP = 16384  # bytes per stream between a load thread's clock checks (loaded.c)
WINDOW_LOADS = 64  # dependent loads per timed chase window
GPU_WINDOW_LOADS = 4096  # per GPU launch
POINT_S = 1.0
WARMUP_S = 0.25
STEPS = 10
KNEE = 1.5  # the knee: where latency reaches this factor of idle
REACHED = 0.95  # achieved/target at or above which a paced point reached its target
GPU_CHUNK = 64 << 20
PEAK_RUNS = 2  # unpaced runs a curve's peak is the best of


def mix_names(spec: str) -> list[str]:
    """'all', one mix, or a comma-separated list -> mixes in MLC's order."""
    if isinstance(spec, str) and spec.strip() == "all":
        return list(MIXES)
    names = word_list(spec, "mix", [*MIXES, "all"])
    if "all" in names:
        raise InvalidRequestError(f"mix '{spec}': all stands alone; give it, or mixes")
    return [m for m in MIXES if m in names]


def check_nt(mix: str) -> None:
    """Non-temporal mixes need AVX (x86-64); say so before anything runs."""
    if mix in NT_MIXES and not compiled.load_has_nt():
        raise NotAvailableError(f"mix {mix} needs non-temporal stores: a CPU with AVX")


# --- load generators ---------------------------------------------------------------------
class Load(Protocol):
    """Something that moves memory at a requested rate and counts what it moved."""

    def start(self, bytes_per_s: float | None) -> None:
        """Start moving memory at ``bytes_per_s`` in all (None: as fast as it goes)."""

    def moved(self) -> int:
        """Bytes moved so far (reads and writes, as the memory sees them)."""
        return 0

    def stop(self) -> None:
        """Stop and wait for the load to end."""


class CpuLoad:
    """Load threads pinned to ``cpus``, each on its own slice of a buffer bound to
    ``node``, moving it with ``mix``."""

    def __init__(self, node: int, cpus: Sequence[int], mix: str, size: int) -> None:
        check_nt(mix)
        self.mix, self.cpus = mix, tuple(cpus)
        grain = len(self.cpus) * compiled.load_mix_streams(MIXES.index(mix)) * STEP
        self.size = max(grain, size // grain * grain)
        self.slice = self.size // len(self.cpus)
        self.buf = NumaBuffer(self.size, Policy.bind(node), populate=True)
        self._threads: compiled.LoadThreads | None = None

    def start(self, bytes_per_s: float | None) -> None:
        """Start the threads at ``bytes_per_s`` in all (None: unpaced)."""
        self._threads = compiled.LoadThreads(self.buf.address, self.slice, self.cpus,
                                             MIXES.index(self.mix), bytes_per_s)  # fmt: skip

    def moved(self) -> int:
        """Bytes the threads have moved so far, all of them together."""
        return self._threads.moved() if self._threads is not None else 0

    def stop(self) -> None:
        """Stop the threads and wait for them (idempotent)."""
        if self._threads is not None:
            self._threads.stop()
            self._threads = None

    def pages_by_node(self) -> dict[int, int]:
        """Pages of the load buffer per node."""
        return self.buf.pages_by_node()

    def close(self) -> None:
        """Stop, then free the buffer."""
        self.stop()
        self.buf.close()


class GpuLoad:
    """GPUs' copy engines streaming pinned host buffers on ``node``: host to device (the
    GPU reads the tier), device to host (it writes it), or both at once; with several
    GPUs, each of them at once. Each lane (a GPU and a direction) keeps two copies in
    flight and paces itself to its share of the rate."""

    def __init__(
        self, gpus: Sequence[Any], node: int, mix: str, size: int, cpus: Sequence[int] = ()
    ) -> None:
        from ..gpu.context import GpuContext
        from ..gpu.memory import DeviceMemory, HostMemory
        from ..gpu.streams import Stream

        if mix not in GPU_MIXES:
            raise InvalidRequestError(
                f"a GPU load moves host memory by copying it: mix read (host to GPU), "
                f"nt-write (GPU to host) or 1:1 (both at once), not {mix}"
            )
        self.mix, self.gpus = mix, tuple(gpus)
        self.cpus = tuple(cpus)  # where the lanes' threads run (never the chase's CPU)
        chunk = min(GPU_CHUNK, max(1 << 20, size // 2))
        self.chunk = chunk
        self._lanes: list[tuple[Any, str, NumaBuffer, Any, Any, Any]] = []
        try:
            for gpu in self.gpus:
                ctx = GpuContext.of(gpu)
                for direction in GPU_MIXES[mix]:
                    host = NumaBuffer(2 * chunk, Policy.bind(node), populate=True)
                    lane = (ctx, direction, host, HostMemory(ctx, host),
                            DeviceMemory(ctx, 2 * chunk), Stream(ctx))  # fmt: skip
                    self._lanes.append(lane)
        except BaseException:
            self._release()
            raise
        self.size = 2 * chunk * len(self._lanes)
        self._moved = [0] * len(self._lanes)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._error: str | None = None

    @property
    def source(self) -> str:
        """Who loads, as results name it: gpu0, or gpu0,gpu1 for several."""
        return ",".join(g.target_name for g in self.gpus)

    def _lane(self, q: int, rate: float | None) -> None:
        from ..gpu.streams import Event

        ctx, direction, host, _pinned, dev, stream = self._lanes[q]
        whole = host.array("uint8")
        halves = [whole[: self.chunk], whole[self.chunk :]]
        try:
            if self.cpus:
                os.sched_setaffinity(0, self.cpus)  # this thread only
            ctx.activate()
            done = [Event(), Event()]
            t0 = time.perf_counter()
            k = 0
            while not self._stop.is_set():
                half = k % 2
                if k >= 2:
                    done[half].synchronize()  # the copy two back has finished
                    self._moved[q] += self.chunk
                if direction == "h2d":
                    dev.copy_from_host(halves[half], offset=half * self.chunk, stream=stream)
                else:
                    dev.copy_to_host(halves[half], offset=half * self.chunk, stream=stream)
                done[half].record(stream)
                k += 1
                if rate:
                    due = t0 + self._moved[q] / rate
                    while not self._stop.is_set():
                        left = due - time.perf_counter()
                        if left <= 0:
                            break
                        time.sleep(min(0.0005, left))
            stream.synchronize()
            for e in done:
                e.close()
        except Exception as e:  # the lane's thread cannot raise: stop() reports it
            self._error = f"{type(e).__name__}: {e}"
        finally:
            del halves, whole  # views of the host buffer: it is unmapped after

    def start(self, bytes_per_s: float | None) -> None:
        """Start the lanes' copies at ``bytes_per_s`` in all (None: unpaced)."""
        self._stop.clear()
        self._moved = [0] * len(self._lanes)
        share = bytes_per_s / len(self._lanes) if bytes_per_s else None
        self._threads = [threading.Thread(target=self._lane, args=(q, share), daemon=True)
                         for q in range(len(self._lanes))]  # fmt: skip
        for t in self._threads:
            t.start()

    def moved(self) -> int:
        """Bytes the copies have finished moving so far."""
        return sum(self._moved)

    def stop(self) -> None:
        """Stop the lanes; OperationError if a lane failed."""
        self._stop.set()
        for t in self._threads:
            t.join()
        self._threads = []
        if self._error is not None:
            err, self._error = self._error, None
            raise OperationError(f"the GPU load failed: {err}")

    def pages_by_node(self) -> dict[int, int]:
        """Pages of the pinned host buffers per node."""
        out: dict[int, int] = {}
        for lane in self._lanes:
            for node, n in lane[2].pages_by_node().items():
                out[node] = out.get(node, 0) + n
        return out

    def close(self) -> None:
        """Stop, then release streams, GPU memory, registrations and buffers."""
        self.stop()
        self._release()

    def _release(self) -> None:
        for _ctx, _d, host, pinned, dev, stream in self._lanes:
            stream.close()
            dev.close()
            pinned.close()
            host.close()
        self._lanes = []


# --- chasers -----------------------------------------------------------------------------
class Chaser(Protocol):
    """Something that times dependent loads in windows."""

    window_loads: int

    def windows(self, seconds: float) -> list[float]:
        """ns per load of each window, window after window, for ``seconds``."""
        return []


class CpuChaser:
    """The idle-latency chase over an arena bound to ``node``, run by the calling thread
    (pinned by the caller to the chase CPU); windows of WINDOW_LOADS loads."""

    window_loads = WINDOW_LOADS

    def __init__(self, node: int, size: int, page: str = "4k") -> None:
        psize = page_size(page)
        group = min(TLB_PAGES * psize, 1 << (size.bit_length() - 1))
        self.size = size // group * group
        self.page_size, self.group = psize, group
        self.buf = NumaBuffer(self.size, Policy.bind(node), huge=huge_pages(psize), populate=False)
        compiled.chase_build(self.buf.address, self.size, STRIDE, group)
        lines = self.size // STRIDE
        compiled.chase_run(self.buf.address, max(16, lines - lines % 16))  # warm: the cycle once
        self._cursor = compiled.ChaseCursor(self.buf.address)

    def windows(self, seconds: float) -> list[float]:
        """ns per load of each window of WINDOW_LOADS loads, for ``seconds``."""
        return [ns / WINDOW_LOADS for ns in self._cursor.windows(WINDOW_LOADS, seconds)]

    def pages_by_node(self) -> dict[int, int]:
        """Pages of the chase arena per node."""
        return self.buf.pages_by_node()

    def close(self) -> None:
        """Free the arena."""
        self.buf.close()


# --- points and curves -------------------------------------------------------------------
def measure_point(
    chaser: Chaser, load: Load | None, rate: float | None, *, seconds: float, warmup: float
) -> LoadedPoint:
    """One point: ``load`` at ``rate`` bytes/s (None: unpaced; no load: idle) while the
    chase runs for ``seconds``."""
    if load is not None:
        load.start(rate)
    try:
        if load is not None:
            time.sleep(warmup)  # the load threads reach their pace
        m0, t0 = (load.moved() if load else 0), time.perf_counter()
        ns = chaser.windows(seconds)
        t1, m1 = time.perf_counter(), (load.moved() if load else 0)
    finally:
        if load is not None:
            load.stop()
    achieved = (m1 - m0) / (t1 - t0)
    ratio = achieved / rate if rate else None
    ordered = sorted(ns)
    return LoadedPoint(
        target_bytes_per_s=rate,
        unpaced=load is not None and rate is None,
        achieved_bytes_per_s=achieved,
        achieved_ratio=ratio,
        reached=ratio is None or ratio >= REACHED,
        latency_ns=statistics.fmean(ns),
        latency_ns_p50=_percentile(ordered, 50),
        latency_ns_p99=_percentile(ordered, 99),
        windows=len(ns),
        duration_s=t1 - t0,
    )


def _percentile(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return math.nan
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def sweep_rates(peak: float, steps: int) -> list[float]:
    """``steps - 1`` paced rates evenly between 0 and the peak (the peak itself is the
    unpaced point)."""
    return [peak * i / steps for i in range(1, steps)]


def check_rates(rates: Sequence[float], peak: float, what: str) -> None:
    """Refuse a requested rate above what the load reached unpaced."""
    over = [r for r in rates if r > peak]
    if over:
        raise InvalidRequestError(
            f"{over[0] / 1e9:.2f} GB/s is above what {what} reached at its peak "
            f"({peak / 1e9:.2f} GB/s with the chase running): ask for at most that"
        )


def knee(points: Sequence[LoadedPoint], idle_ns: float, factor: float) -> float | None:
    """The load bandwidth where the median latency first reaches ``factor`` x idle,
    linearly between the points around it; None when no point gets there. (Medians: one
    preempted window moves a mean, not a median.)"""
    ordered = sorted(points, key=lambda p: p.achieved_bytes_per_s)
    limit = factor * idle_ns
    prev = None
    for p in ordered:
        if p.latency_ns_p50 >= limit:
            if prev is None or p.latency_ns_p50 == prev.latency_ns_p50:
                return p.achieved_bytes_per_s
            f = (limit - prev.latency_ns_p50) / (p.latency_ns_p50 - prev.latency_ns_p50)
            return prev.achieved_bytes_per_s + f * (
                p.achieved_bytes_per_s - prev.achieved_bytes_per_s
            )
        prev = p
    return None


def curve(
    chaser: Chaser,
    load: Load,
    *,
    rates: Sequence[float] | None,
    fractions: Sequence[float] | None = None,
    steps: int,
    seconds: float,
    warmup: float,
    describe: str,
    on_point: Callable[[LoadedPoint], None] | None = None,
) -> tuple[list[LoadedPoint], float]:
    """The points of one curve, idle first, and the unpaced peak."""
    # The peak sets every paced rate of a sweep, so one host stall during it would
    # shift the whole curve: it is the better of two unpaced runs (a stall only ever
    # lowers a rate).
    top = max((measure_point(chaser, load, None, seconds=seconds, warmup=warmup)
               for _ in range(PEAK_RUNS)), key=lambda q: q.achieved_bytes_per_s)  # fmt: skip
    peak = top.achieved_bytes_per_s
    if rates is not None:
        check_rates(rates, peak, describe)
    if fractions is not None:
        wanted = [f * peak for f in fractions if f < 1]  # 1: the unpaced point itself
    else:
        wanted = list(rates) if rates is not None else sweep_rates(peak, steps)
    points = [measure_point(chaser, None, None, seconds=seconds, warmup=0)]
    for r in wanted:
        points.append(measure_point(chaser, load, r, seconds=seconds, warmup=warmup))
        if on_point:
            on_point(points[-1])
    points.append(top)
    return points, peak


def defaults(size: int | None, load_size: int | None) -> tuple[int, int, float, float, int]:
    """Chase arena, load buffer, seconds per point, warm-up, sweep steps (``size``:
    checked at the door, at least ``values.CHASE_MIN_SIZE``)."""
    chase = size or chase_default_size()
    load = load_size or default(max(4 * last_level_cache(), 256 << 20), 16 << 20)
    return (chase, load, default(int(POINT_S * 1e3), 200) / 1e3,
            default(int(WARMUP_S * 1e3), 50) / 1e3, default(STEPS, 4))  # fmt: skip


def loaded_latency(
    chase: Pair,
    load_node: Pair,
    load_cpus: Sequence[int],
    *,
    mix: str = "read",
    rates: Sequence[float] | None = None,
    fractions: Sequence[float] | None = None,
    steps: int | None = None,
    size: int | None = None,
    load_size: int | None = None,
    seconds: float | None = None,
    knee_factor: float = KNEE,
    gpus: Sequence[Any] = (),
    gpu_chaser: Any = None,
) -> LoadedLatencyResult:
    """The latency of ``chase.node`` from ``chase.cpus[0]`` (or from ``gpu_chaser``, a GPU
    chase over that memory) while CPUs ``load_cpus`` (or ``gpus``' copy engines) load
    ``load_node.node`` with ``mix``, at ``rates`` bytes/s or a sweep of ``steps``."""
    from .conditions import pinned

    began = time.perf_counter()
    chase_size, lsize, point_s, warm_s, n_steps = defaults(size, load_size)
    seconds = seconds or point_s
    steps = steps or n_steps
    if knee_factor <= 1:
        raise InvalidRequestError(f"the knee factor must be above 1, not {knee_factor}")
    chase.check_fits(chase_size if gpu_chaser is None else 0)
    load: CpuLoad | GpuLoad
    if gpus:
        load = GpuLoad(gpus, load_node.node, mix, lsize, load_cpus)
        load_from = load.source
    else:
        if not load_cpus:
            raise InvalidRequestError("no CPU is left for load threads")
        load_node.check_fits(lsize)
        load = CpuLoad(load_node.node, load_cpus, mix, lsize)
        load_from = chase.initiator.name
    chaser: Any = None
    try:
        chaser = gpu_chaser if gpu_chaser is not None else CpuChaser(chase.node, chase_size)
        describe = f"the {mix} load on {load_node.target.name}"
        if gpu_chaser is not None:
            points, peak = curve(chaser, load, rates=rates, fractions=fractions, steps=steps,
                                 seconds=seconds, warmup=warm_s, describe=describe)  # fmt: skip
        else:
            with pinned(chase.cpus[0]):
                points, peak = curve(chaser, load, rates=rates, fractions=fractions,
                                     steps=steps, seconds=seconds, warmup=warm_s,
                                     describe=describe)  # fmt: skip
        chase_pages = chaser.pages_by_node()
        load_pages = load.pages_by_node()
    finally:
        load.close()
        if chaser is not None and gpu_chaser is None:
            chaser.close()
    chase.require_placed(chase_pages, "chase arena")
    load_node.require_placed(load_pages, "load buffer")
    idle = points[0].latency_ns_p50
    reads, writes = READS_WRITES[mix]
    ordered = sorted(points[1:], key=lambda p: p.achieved_bytes_per_s)
    return LoadedLatencyResult(
        **chase.result_fields(chase_pages, cpus=chase.cpus[:1]),
        size=getattr(chaser, "size", chase_size),
        page_size=getattr(chaser, "page_size", 4096),
        mix=mix, reads=reads, writes=writes,
        load_target=load_node.target.name, load_node=load_node.node, load_from=load_from,
        load_cpus=tuple(load_cpus), load_size=load.size, load_gpus=tuple(gpus),
        load_pages_on_node=load_pages.get(load_node.node, 0),
        load_pages=sum(load_pages.values()),
        points=(points[0], *ordered), idle_latency_ns=idle, peak_bytes_per_s=peak,
        knee_factor=knee_factor, knee_bytes_per_s=knee(points, idle, knee_factor),
        window_loads=chaser.window_loads, measure_s=time.perf_counter() - began,
    )  # fmt: skip


def mix_bandwidth(
    p: Pair, cpus: Sequence[int], mix: str, *, size: int | None = None,
    samples: int | None = None, seconds: float | None = None,
) -> BandwidthResult:  # fmt: skip
    """Peak bandwidth of ``mix`` on ``p.node`` from threads on ``cpus``, unpaced (MLC's
    peak injection bandwidth): best and median of ``samples`` timed windows."""
    _, lsize, point_s, warm_s, _ = defaults(None, size)
    samples = samples or default(5, 2)
    if samples < 1:
        raise InvalidRequestError(f"samples must be at least 1, not {samples}")
    seconds = seconds or point_s / 2
    p.check_fits(lsize)
    load = CpuLoad(p.node, cpus, mix, lsize)
    rates = []
    try:
        load.start(None)
        time.sleep(warm_s)
        for _ in range(samples):
            m0, t0 = load.moved(), time.perf_counter()
            time.sleep(seconds)
            rates.append((load.moved() - m0) / (time.perf_counter() - t0))
        load.stop()
        placed = load.pages_by_node()
        size_used = load.size
    finally:
        load.close()
    p.require_placed(placed, "load buffer")
    return BandwidthResult(
        **p.result_fields(placed, cpus=cpus), size=size_used, page_size=4096, kernel=mix,
        bytes_per_s=max(rates), bytes_per_s_median=statistics.median(rates), samples=samples,
        threads=len(cpus), nt_stores=mix in NT_MIXES, mix=mix, **cache_fit(size_used),
    )  # fmt: skip
