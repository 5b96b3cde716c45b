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

import os
import statistics
import time
from typing import Any

from ..errors import InvalidRequestError
from ..gpu import driver as drv
from ..gpu.devices import GpuDevice
from ..gpu.memory import DeviceMemory, GpuContext, HostMemory
from ..gpu.staged import MAX_THREADS, StagedCopier
from ..gpu.streams import Event, Stream
from ..numa.placement import NumaBuffer, allocate
from ..system import System, snapshot
from .context import Placement, available_gpus, check_fits, place, resolve_gpu
from .results import BenchResult

DIRECTIONS = ("h2d", "d2h")
PHASES: dict[str, list[tuple[str, ...]]] = {
    "h2d": [("h2d",)],
    "d2h": [("d2h",)],
    "both": [("h2d",), ("d2h",)],
    "bidir": [("h2d", "d2h")],
}
WARMUP = 2


def measure_transfer(
    gpu: str,
    target: str,
    *,
    direction: str = "both",
    size: int = 1 << 30,
    pageable: bool = False,
    staged: bool = False,
    iterations: int = 20,
) -> list[BenchResult]:
    """``gpu``: gpuN or "all". ``direction``: h2d, d2h, both (one after the other) or
    bidir (at once). One result per phase (h2d, d2h or bidir)."""
    if direction not in PHASES:
        raise InvalidRequestError(f"direction '{direction}': use h2d, d2h, both or bidir")
    if iterations < 1:
        raise InvalidRequestError("iterations must be at least 1")
    if size <= 0:
        raise InvalidRequestError(f"size must be positive, not {size}")
    every_gpu = gpu.strip().lower() == "all"
    mode = "staged" if staged else "pageable" if pageable else "pinned"
    if mode != "pinned" and (direction == "bidir" or every_gpu):
        raise InvalidRequestError(
            f"{mode} copies block the host, so they cannot run at once (bidir, --gpu all): "
            "measure one GPU and one direction at a time (h2d, d2h or both)"
        )
    if pageable and staged:
        raise InvalidRequestError("--pageable and --staged: choose one (both copy unpinned memory)")
    s = snapshot()
    gpus = list(available_gpus(s)) if every_gpu else [resolve_gpu(gpu, s)]
    p = place(target, None, s)
    lanes_per_phase = max(len(ph) for ph in PHASES[direction]) * len(gpus)
    check_fits(size * lanes_per_phase, p)
    results = []
    for phase in PHASES[direction]:
        lanes = [_Lane(g, d, p, size, mode, _copy_cpus(g, s)) for g in gpus for d in phase]
        try:
            results.append(_measure(lanes, p, size, iterations, every_gpu, phase, mode))
        finally:
            for lane in lanes:
                lane.close()
    return results


def _copy_cpus(g: GpuDevice, s: System) -> list[int] | None:
    """The staged copy's threads: CPUs of the GPU's nearest node this process may use."""
    allowed = os.sched_getaffinity(0)
    node = next((n.node for n in s.nodes if n.node.id == g.numa_node), None)
    cpus = [c for c in node.cpus if c in allowed][:MAX_THREADS] if node else []
    return cpus or None


class _Lane:
    """One GPU copying in one direction: its buffers, stream and events."""

    def __init__(self, g: GpuDevice, direction: str, p: Placement, size: int, mode: str,
                 copy_cpus: list[int] | None) -> None:  # fmt: skip
        self.gpu, self.direction, self.size, self.mode = g, direction, size, mode
        self.ctx = GpuContext(g.ordinal)
        self._closers: list[Any] = []
        self.dev = self._keep(DeviceMemory(self.ctx, size))
        self.host: NumaBuffer = self._keep(allocate(size, p.target))
        if mode == "pinned":
            self._keep(HostMemory(self.ctx, self.host))
        self.copier = (
            self._keep(StagedCopier(self.ctx, node=g.numa_node, cpus=copy_cpus))
            if mode == "staged"
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
                self.copier.to_device(self.dev.ptr, self.host)
            else:
                self.copier.to_host(self.host, self.dev.ptr)
            self.staged_ms = (time.perf_counter() - t0) * 1e3
            return
        ffi, lib = drv.driver()
        h, s = ffi.cast("void *", self.host.address), self.stream.handle
        self.start.record(self.stream)
        if self.direction == "h2d":
            rc, call = lib.cuMemcpyHtoDAsync_v2(self.dev.ptr, h, self.size, s), "cuMemcpyHtoDAsync"
        else:
            rc, call = lib.cuMemcpyDtoHAsync_v2(h, self.dev.ptr, self.size, s), "cuMemcpyDtoHAsync"
        drv.check(call, rc)
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


def _measure(lanes: list[_Lane], p: Placement, size: int, iterations: int, every_gpu: bool,
             phase: tuple[str, ...], mode: str) -> BenchResult:  # fmt: skip
    own: list[list[float]] = [[] for _ in lanes]
    wall: list[float] = []
    for it in range(WARMUP + iterations):
        t0 = time.perf_counter()
        for lane in lanes:
            lane.enqueue()
        ms = [lane.finish() for lane in lanes]
        elapsed = time.perf_counter() - t0
        if it >= WARMUP:
            wall.append(elapsed)
            for q, m in enumerate(ms):
                own[q].append(m)
    # one lane: the copy's own GPU time; lanes at once: the host's wall time
    times = [m / 1e3 for m in own[0]] if len(lanes) == 1 else wall
    total = size * len(lanes)
    per_lane = [
        {
            "gpu": lane.gpu.target_name,
            "direction": lane.direction,
            "bytes_per_s": size / (min(t) / 1e3),
            "bytes_per_s_median": size / (statistics.median(t) / 1e3),
        }
        for lane, t in zip(lanes, own, strict=True)
    ]
    first = lanes[0]
    params: dict[str, Any] = {
        "direction": "bidir" if len(phase) > 1 else phase[0],
        "pinned": mode == "pinned",
        "staged": mode == "staged",
        "iterations": iterations,
        "gpu": "all" if every_gpu else first.gpu.name,
        "pages_on_node": sum(lane.host.pages_by_node().get(p.node, 0) for lane in lanes),
    }
    params["lanes"] = per_lane
    if mode == "staged" and first.copier is not None:
        params |= {"chunk": first.copier.chunk, "copy_threads": first.copier.threads}
    return BenchResult(
        benchmark="transfer", target=p.target, node=p.node,
        initiator="all" if every_gpu else first.gpu.target_name, cpus=(),
        size=size, page_size=4096,
        figures={"bytes_per_s": total / min(times),
                 "bytes_per_s_median": total / statistics.median(times)},
        params=params,
    )  # fmt: skip
