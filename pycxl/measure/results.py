"""Result objects of every benchmark: typed fields, one JSON shape, units in the names.

Every result says what was measured (``target``, its NUMA ``node``), from where
(``initiator``, the ``cpus`` that ran it), over how much memory (``size``, ``page_size``)
and, for host memory, how many of its pages sat on the target node when it was measured
(``pages_on_node`` of ``pages``): a figure is never reported for memory that was not on
the tier it names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ..base.jsontype import Json

if TYPE_CHECKING:
    from ..gpu.inventory import GpuDevice
    from .targets import Pair

# A measured figure further than this factor from the advertised one (either way) is
# called out: firmware figures are often wrong, and so is a misplaced measurement.
ADVERTISED_FACTOR = 2.0
# a field that carries resolved objects, not figures: the JSON has their names already
# (bench_result_json, below, leaves such fields out)
_OBJECTS = {"json": False}


def factor_apart(measured: float, advertised: float | None) -> float | None:
    """How many times apart two figures are (1.0: equal), whichever is larger."""
    if advertised is None or advertised <= 0 or measured <= 0:
        return None
    return max(measured / advertised, advertised / measured)


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    """What every measurement has. Subclasses add the figures and their settings."""

    benchmark: ClassVar[str] = ""
    target: str  # the name the user gave (cxl0, dram0, node1, gpu0)
    node: int | None  # NUMA node of the target memory; None for GPU memory
    initiator: str  # dram0, cpu3, gpu0...
    cpus: tuple[int, ...]  # CPUs that ran the measurement (none for GPU initiators)
    size: int  # bytes of the working set (per array for bandwidth)
    page_size: int  # bytes; 0 for GPU memory
    pages_on_node: int | None = None  # host memory: pages found on ``node`` afterwards
    pages: int | None = None  # host memory: pages of the measured buffers
    # what ``target`` and ``initiator`` resolved to, for code that needs more than a name
    pair: Pair | None = field(default=None, compare=False, repr=False, metadata=_OBJECTS)


@dataclass(frozen=True, kw_only=True)
class LatencyResult(BenchResult):
    """Load-to-use latency by pointer chase: best and median of ``samples``."""

    benchmark: ClassVar[str] = "latency"
    latency_ns: float
    latency_ns_median: float
    loads: int  # dependent loads per sample
    samples: int
    stride: int  # bytes between chased lines
    tlb_group: int  # bytes per randomisation group
    gpu: str | None = None  # the GPU's name, for GPU initiators
    measure_s: float = 0.0  # wall time of the whole measurement
    last_level_cache: int | None = None  # bytes: the CPUs' last-level cache, or a GPU's L2
    fits_in_cache: bool | None = None  # the arena fits in it: the figure is the cache's
    # the platform's read latency for these CPUs reaching the node (HMAT, CDAT), and how
    # many times apart it is from latency_ns_median; None: nothing advertised for them
    advertised_latency_ns: float | None = None
    advertised_factor: float | None = None


@dataclass(frozen=True, kw_only=True)
class BandwidthResult(BenchResult):
    """STREAM bandwidth of one kernel: best and median of ``samples`` timed passes."""

    benchmark: ClassVar[str] = "bandwidth"
    kernel: str  # copy, scale, add, triad; or a load mix (read, 3:1, 2:1, 1:1, nt-write)
    bytes_per_s: float
    bytes_per_s_median: float
    samples: int  # timed passes (one more, untimed, runs first)
    threads: int | None = None  # CPU initiators
    nt_stores: bool = False
    mix: str | None = None  # the load mix, for peak bandwidth by mix (MLC's peak injection)
    gpu: str | None = None  # GPU STREAM: the GPU's name and launch shape
    grid: int | None = None
    block: int | None = None
    unroll: int | None = None
    last_level_cache: int | None = None  # bytes: the CPUs' last-level cache, or a GPU's L2
    fits_in_cache: bool | None = None  # the kernel's arrays fit in it: the cache's figure
    # the platform's read bandwidth for these CPUs reaching the node (HMAT, CDAT), and
    # how many times apart it is from bytes_per_s; None: nothing advertised for them
    advertised_bytes_per_s: float | None = None
    advertised_factor: float | None = None


@dataclass(frozen=True, kw_only=True)
class FirstTouchResult(BenchResult):
    """Time of each page's first write (allocate, zero, map), as percentiles."""

    benchmark: ClassVar[str] = "first-touch"
    p50_ns: float
    p90_ns: float
    p99_ns: float
    max_ns: float
    bytes_per_s: float
    timer_ns: int  # the clock's own cost, taken off each page's time


@dataclass(frozen=True)
class Lane:
    """One GPU copying in one direction, within a transfer."""

    gpu: str
    direction: str
    bytes_per_s: float
    bytes_per_s_median: float
    # with other lanes at once: this lane's best alone, measured just before (None for a
    # lane that ran alone); alone / bytes_per_s is what sharing the links cost it
    alone_bytes_per_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class TransferResult(BenchResult):
    """Copy bandwidth between GPUs and host memory: all lanes together, and each lane."""

    benchmark: ClassVar[str] = "transfer"
    direction: str  # h2d, d2h or bidir
    memory: str  # pinned, pageable or staged
    bytes_per_s: float
    bytes_per_s_median: float
    samples: int
    gpu: str  # the GPU's name, or 'all'
    lanes: tuple[Lane, ...] = ()
    chunk: int | None = None  # staged copies: staging buffer size
    copy_threads: int | None = None  # staged copies: CPU threads


@dataclass(frozen=True)
class LoadedPoint:
    """One point of a loaded-latency curve: the load asked for, what it reached, and the
    chase latency meanwhile (mean, and p50/p99 over windows of ``window_loads``)."""

    target_bytes_per_s: float | None  # None: no load (idle) or unpaced (as fast as it goes)
    unpaced: bool
    achieved_bytes_per_s: float  # measured over the chase's time, reads and writes
    achieved_ratio: float | None  # achieved / target, for paced points
    reached: bool  # a paced point reached at least 95% of its target
    latency_ns: float
    latency_ns_p50: float
    latency_ns_p99: float
    windows: int
    duration_s: float


@dataclass(frozen=True, kw_only=True)
class LoadedLatencyResult(BenchResult):
    """Latency of ``target`` from ``initiator`` while a load of ``mix`` runs on
    ``load_target`` from ``load_from`` (CPUs ``load_cpus``, or a GPU's copy engines),
    at a series of bandwidths: idle first, then by achieved bandwidth."""

    benchmark: ClassVar[str] = "loaded-latency"
    mix: str
    reads: int  # the mix's reads : writes, as the memory sees them
    writes: int
    load_target: str
    load_node: int
    load_from: str  # dram0 (CPUs) or gpu0 (copy engines)
    load_cpus: tuple[int, ...]  # the load threads' CPUs (a GPU load's copy threads)
    load_size: int
    load_pages_on_node: int
    load_pages: int
    points: tuple[LoadedPoint, ...]
    idle_latency_ns: float  # the idle point's median (p50) window
    peak_bytes_per_s: float  # the unpaced load, with the chase running
    knee_factor: float
    knee_bytes_per_s: float | None  # load where the median reached knee_factor x idle
    window_loads: int
    measure_s: float = 0.0
    # the GPUs whose copy engines loaded (none: CPUs did)
    load_gpus: tuple[GpuDevice, ...] = field(default=(), compare=False, repr=False,
                                             metadata=_OBJECTS)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class OffloadResult(BenchResult):
    """A stack of layers run on a GPU with its weights in HBM (``mode`` hbm) or on a
    host tier: streamed by pycxl (pycxl), copied with ``.to()`` from pageable memory
    (to), or copied from pinned memory with ``non_blocking`` and no look-ahead (pinned).
    One step is a forward pass, or forward and backward (gradients back to the host).

    ``bound_s`` is what the link and the GPU allow: max(the hbm step, the least time the
    link needs for the step's copies at its pinned bandwidth, one way and both ways at
    once), all measured in the same run (``pycxl.measure.offload``); ``hidden`` is the
    share of the copy time the step hid behind compute. Mode ``update`` is the optimizer
    step alone, its state on the tier, its bound the split's (``update_*``)."""

    benchmark: ClassVar[str] = "offload"
    mode: str
    backward: bool
    gpu: str  # the GPU's name
    layers: int
    width: int
    tokens: int  # rows of the activations (batch x sequence)
    layer_bytes: int
    lookahead: int | None  # pycxl mode
    step_s: float  # median
    step_s_best: float
    samples: int
    bytes_to_device: int  # per step
    bytes_to_host: int  # per step
    compute_s: float  # the hbm step (the same run)
    pinned_h2d_bytes_per_s: float  # from the tier, measured in the same run
    pinned_d2h_bytes_per_s: float
    pinned_bidir_bytes_per_s: float  # both directions at once, the sum
    bound_s: float
    vs_bound: float  # step_s / bound_s
    hidden: float | None  # share of copy time hidden behind compute (host modes)
    link_bytes_per_s: float | None  # bytes to the device per second of step
    at_once: int = 1  # GPUs streaming from the tier at the same time (bench offload --gpu all)
    alone_s: float | None = None  # with others at once: this GPU's median step alone
    # mode update: the layers each side updated, and each side's rate alone (parameters/s)
    update_cpu_blocks: tuple[int, ...] | None = None
    update_gpu_blocks: tuple[int, ...] | None = None
    update_cpu_rate: float | None = None
    update_gpu_rate: float | None = None


# the JSON of a result: one shape for all (pycxl bench --json, the library's users)
def bench_result_json(r: BenchResult) -> Json:
    """A benchmark result: field names as keys, the benchmark's name first; nested
    results as objects (fields marked ``json: False`` hold objects and stay out)."""
    out: Json = {"benchmark": r.benchmark}
    for f in dataclasses.fields(r):
        if f.metadata.get("json", True):
            out[f.name] = _plain(getattr(r, f.name))
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value
