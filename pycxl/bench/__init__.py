"""Benchmarks of memory tiers, by name, from CPUs and GPUs: latency, bandwidth, first
touch, loaded latency, host<->GPU transfers, layer offload, and the initiator x target
matrix.

Every measurement takes names (``"cxl0"``, ``"gpu0"``, ``"cpu3"``), sizes as bytes or
strings (``"256M"``), and returns a list of typed results::

    >>> from pycxl import bench
    >>> (lat,) = bench.measure_latency("cxl0")
    >>> lat.latency_ns, lat.pages_on_node == lat.pages
    >>> [r.bytes_per_s for r in bench.measure_bandwidth("dram0", kernel="triad")]

``bench.dispatch`` decides which measurement a pair of names gets; the measurements
themselves, of resolved pairs, are in ``pycxl.measure``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base._lazy import lazy_exports

if TYPE_CHECKING:
    from ..measure.results import (
        BandwidthResult as BandwidthResult,
        BenchResult as BenchResult,
        FirstTouchResult as FirstTouchResult,
        Lane as Lane,
        LatencyResult as LatencyResult,
        LoadedLatencyResult as LoadedLatencyResult,
        LoadedPoint as LoadedPoint,
        OffloadResult as OffloadResult,
        TransferResult as TransferResult,
    )
    from .dispatch import (
        latency_sweep_sizes as latency_sweep_sizes,
        measure_bandwidth as measure_bandwidth,
        measure_first_touch as measure_first_touch,
        measure_latency as measure_latency,
        measure_loaded_latency as measure_loaded_latency,
        measure_offload as measure_offload,
        measure_transfer as measure_transfer,
    )
    from .matrix import (
        Matrix as Matrix,
        MatrixCell as MatrixCell,
        matrix_pairs as matrix_pairs,
        measure_matrix as measure_matrix,
    )

# every exported name and the module it loads from (a test holds the imports above equal)
_LAZY = {
    **dict.fromkeys(
        ("latency_sweep_sizes", "measure_bandwidth", "measure_first_touch", "measure_latency",
         "measure_loaded_latency", "measure_offload", "measure_transfer"),
        "dispatch",
    ),
    **dict.fromkeys(("Matrix", "MatrixCell", "matrix_pairs", "measure_matrix"), "matrix"),
    **dict.fromkeys(
        ("BandwidthResult", "BenchResult", "FirstTouchResult", "Lane", "LatencyResult",
         "LoadedLatencyResult", "LoadedPoint", "OffloadResult", "TransferResult"),
        ".measure.results",
    ),
}  # fmt: skip

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
