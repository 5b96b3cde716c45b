"""Copy bandwidth between GPUs and host memory on a tier (nvbandwidth's method).

Each copy stream (a *lane*: one GPU, one direction) has its own host buffer placed on
the target node and, unless pageable, pinned and registered with the driver, its own
device buffer and its own CUDA stream. A lane alone is timed by CUDA events around the
copy. Lanes that run at once (``bidir``: both directions on one GPU; ``gpu="all"``:
every GPU against the same tier) are started together, and the aggregate is the bytes
of all lanes over the host's wall time until the last one ends; each lane's own event
time is reported with it. Two unmeasured rounds, then ``iterations`` measured ones; best
and median.

``staged`` copies pageable memory through pycxl's pipelined copier (gpu.staged) instead
of the driver's own pageable path, and is timed by the host's clock around the whole copy.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..base.errors import InvalidRequestError
from ..base.values import word
from ..gpu.context import GpuContext
from ..gpu.inventory import GpuDevice
from ..gpu.memory import DeviceMemory, HostMemory
from ..gpu.staged import StagedCopier
from ..gpu.streams import Event, Stream
from ..numa.placement import NumaBuffer
from ..numa.policy import Policy
from .conditions import default
from .results import Lane, TransferResult
from .targets import Pair

DIRECTIONS = ("h2d", "d2h", "both", "bidir")
MEMORY = ("pinned", "pageable", "staged")
PHASES: dict[str, list[tuple[str, ...]]] = {
    "h2d": [("h2d",)],
    "d2h": [("d2h",)],
    "both": [("h2d",), ("d2h",)],
    "bidir": [("h2d", "d2h")],
}
WARMUP = 2
DEFAULT_SIZE = 1 << 30
SAMPLES = 20


def check_transfer(direction: str, memory: str, lanes_at_once: int) -> None:
    """Refuse what cannot work, before anything is allocated."""
    word(direction, "direction", PHASES)
    word(memory, "memory", MEMORY)
    if memory != "pinned" and (direction == "bidir" or lanes_at_once > 1):
        raise InvalidRequestError(
            f"{memory} copies block the host, so they cannot run at once (bidir, every GPU): "
            "measure one GPU and one direction at a time (h2d, d2h or both)"
        )


def copy_bandwidth(
    gpus: Sequence[GpuDevice],
    p: Pair,
    *,
    direction: str = "both",
    size: int | None = None,
    memory: str = "pinned",
    samples: int | None = None,
    copy_cpus: Mapping[int, Sequence[int]] | None = None,
    every_gpu: bool = False,
) -> list[TransferResult]:
    """Copies between each GPU of ``gpus`` (at once) and host memory on ``p.node``.
    ``memory``: pinned, pageable (the driver's copy) or staged (pycxl's pipelined copy,
    its threads on ``copy_cpus[gpu.index]``). One result per phase of ``direction``."""
    check_transfer(direction, memory, len(gpus))
    size = size or default(DEFAULT_SIZE, 16 << 20)
    samples = samples or default(SAMPLES, 2)
    if samples < 1:
        raise InvalidRequestError(f"samples must be at least 1, not {samples}")
    if size <= 0:
        raise InvalidRequestError(f"size must be positive, not {size}")
    lanes_per_phase = max(len(ph) for ph in PHASES[direction]) * len(gpus)
    p.check_fits(size * lanes_per_phase)
    cpus = copy_cpus or {}
    results = []
    for phase in PHASES[direction]:
        lanes = [_Lane(g, d, p, size, memory, cpus.get(g.index)) for g in gpus for d in phase]
        try:
            results.append(_measure(lanes, p, size, samples, every_gpu, phase, memory))
        finally:
            for lane in lanes:
                lane.close()
    return results


class _Lane:
    """One GPU copying in one direction: its buffers, stream and events."""

    def __init__(self, g: GpuDevice, direction: str, p: Pair, size: int, memory: str,
                 copy_cpus: Sequence[int] | None) -> None:  # fmt: skip
        self.gpu, self.direction, self.size, self.memory = g, direction, size, memory
        self.ctx = GpuContext.of(g)
        self._closers: list[Any] = []
        self.dev: DeviceMemory = self._keep(DeviceMemory(self.ctx, size))
        # counted by the pair's check_fits: the node's memory is not read again
        self.host: NumaBuffer = self._keep(NumaBuffer(size, Policy.bind(p.node)))
        if memory == "pinned":
            self._keep(HostMemory(self.ctx, self.host))
        self.copier = (
            self._keep(StagedCopier(self.ctx, node=g.numa_node, cpus=copy_cpus))
            if memory == "staged"
            else None
        )
        self.stream = self._keep(Stream(self.ctx))
        self.start: Event = self._keep(Event())
        self.end: Event = self._keep(Event())
        self.staged_ms = 0.0

    def _keep(self, obj: Any) -> Any:
        self._closers.append(obj)
        return obj

    def enqueue(self) -> None:
        """Start one copy; a staged copy runs to its end here (the CPU does half of it)."""
        self.ctx.activate()
        if self.copier is not None:
            t0 = time.perf_counter()
            if self.direction == "h2d":
                self.copier.to_device(self.dev, self.host)
            else:
                self.copier.to_host(self.host, self.dev)
            self.staged_ms = (time.perf_counter() - t0) * 1e3
            return
        self.start.record(self.stream)
        if self.direction == "h2d":
            self.dev.copy_from_host(self.host, stream=self.stream)
        else:
            self.dev.copy_to_host(self.host, stream=self.stream)
        self.end.record(self.stream)

    def finish(self) -> float:
        """Wait for the copy; its own time in ms."""
        if self.copier is not None:
            return self.staged_ms
        self.end.synchronize()
        return self.end.ms_since(self.start)

    def close(self) -> None:
        for obj in reversed(self._closers):
            obj.close()


def _rounds(lanes: Sequence[_Lane], samples: int) -> tuple[list[list[float]], list[float]]:
    """Each lane's own copy times (ms) and the host's wall times (s) of ``samples``
    rounds with every lane of ``lanes`` started together, after WARMUP unmeasured ones."""
    own: list[list[float]] = [[] for _ in lanes]
    wall: list[float] = []
    for it in range(WARMUP + samples):
        t0 = time.perf_counter()
        for lane in lanes:
            lane.enqueue()
        ms = [lane.finish() for lane in lanes]
        elapsed = time.perf_counter() - t0
        if it >= WARMUP:
            wall.append(elapsed)
            for q, m in enumerate(ms):
                own[q].append(m)
    return own, wall


def _measure(lanes: list[_Lane], p: Pair, size: int, samples: int, every_gpu: bool,
             phase: tuple[str, ...], memory: str) -> TransferResult:  # fmt: skip
    # lanes at once: each alone first, so the result says what sharing cost each
    several = len(lanes) > 1
    alone = [size / (min(_rounds([lane], samples)[0][0]) / 1e3) if several else None
             for lane in lanes]  # fmt: skip
    own, wall = _rounds(lanes, samples)
    # one lane: the copy's own GPU time; lanes at once: the host's wall time
    times = [m / 1e3 for m in own[0]] if len(lanes) == 1 else wall
    total = size * len(lanes)
    per_lane = tuple(
        Lane(
            gpu=lane.gpu.target_name,
            direction=lane.direction,
            bytes_per_s=size / (min(t) / 1e3),
            bytes_per_s_median=size / (statistics.median(t) / 1e3),
            alone_bytes_per_s=alone[q],
        )
        for q, (lane, t) in enumerate(zip(lanes, own, strict=True))
    )
    pages: dict[int, int] = {}
    for lane in lanes:
        for node, count in lane.host.pages_by_node().items():
            pages[node] = pages.get(node, 0) + count
    first = lanes[0]
    return TransferResult(
        **{**p.result_fields(pages, cpus=()),
           "initiator": "all" if every_gpu else first.gpu.target_name},
        size=size, page_size=4096,
        direction="bidir" if len(phase) > 1 else phase[0], memory=memory,
        bytes_per_s=total / min(times), bytes_per_s_median=total / statistics.median(times),
        samples=samples, gpu="all" if every_gpu else first.gpu.name, lanes=per_lane,
        chunk=first.copier.chunk if first.copier else None,
        copy_threads=first.copier.threads if first.copier else None,
    )  # fmt: skip
