"""A stack of layers whose weights live on a host tier, run on a GPU: pycxl's streaming
against what users run today, and against the bound the link and the GPU allow.

The stack is ``layers`` bf16 ``Linear(width, width)`` layers (ReLU between them) over
``tokens`` rows of activations: bytes per layer are ``2 * width**2``, compute per layer
``2 * tokens * width**2`` flops (three times that with the backward pass). Modes:

- ``hbm``: every weight in GPU memory: the compute time, the bound's first term.
- ``pycxl``: weights in pinned memory on the tier, streamed by ``LayerOffload`` (a copy
  stream with look-ahead; gradients of the backward pass go back to the tier).
- ``to``: weights in pageable memory on the tier, ``w.to("cuda")`` as each layer runs
  (what a plain loop, and accelerate's ``cpu_offload``, do).
- ``pinned``: weights in pinned memory on the tier, ``w.to("cuda", non_blocking=True)``
  as each layer runs, no look-ahead.
- ``update`` (with the backward pass): the optimizer step alone, AdamW over the layers
  with their fp32 masters and moments on the tier (``ModelOffload``: each layer updated
  on the CPU or on the GPU, split by rates measured at set-up and refined from the first
  steps). Its bound is the split's: each side at the rate it showed alone, both at once.

Each mode runs two steps untimed, then ``samples`` timed ones (host clock, the GPU
synchronised at both ends: a step is done when its results, gradients included, are
where they go). The pinned copy bandwidth from the tier is measured in the same run
(the best of ten copies: a bound takes the link at its best);
the bound is max(hbm step, the link's least time): the bytes to the device are the
layer copies no schedule with two device buffers avoids (``stream_copies``: every layer
in a forward pass; with the backward pass each layer twice, but the two at each turn);
with the backward pass, half of them come in during the forward pass, and the other half
while the gradients go out, at the link's measured rate both ways at once
(``link_time``).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..base.errors import InvalidRequestError, OperationError
from ..base.values import (
    MAX_LAYERS,
    MAX_SAMPLES,
    MAX_TOKENS,
    MAX_WIDTH,
    count,
    lookahead as checked_lookahead,
)
from ..gpu.context import GpuContext
from ..gpu.inventory import GpuDevice
from ..gpu.memory import HostMemory
from ..numa.placement import NumaBuffer
from ..numa.policy import Policy
from ..torch._import import import_torch
from .conditions import default
from .results import OffloadResult
from .targets import Pair

MODES = ("hbm", "pycxl", "to", "pinned", "update")
STREAMING = MODES[:4]  # what a step of layers is run in; update times the optimizer
# step times; (pages on the node, pages) of the host weights; bytes to and from the
# device per step, where the mode counts them
Timing = tuple[list[float], tuple[int, int], tuple[int, int] | None]
LAYERS = 16
WIDTH = 8192
TOKENS = 1024
SAMPLES = 5
WARMUP = 2
COPY_SAMPLES = 10


def check_offload(
    modes: Sequence[str],
    layers: int,
    width: int,
    tokens: int,
    lookahead: int,
    samples: int,
    backward: bool = False,
) -> tuple[str, ...]:
    """The modes to run, in order (hbm first: the others are measured against it);
    refuse settings that cannot run, before anything is allocated."""
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        named = ",".join(bad).strip(", ")
        raise InvalidRequestError(f"mode {named or '(an empty list)'}: use {', '.join(MODES)}")
    if "update" in modes and not backward:
        raise InvalidRequestError(
            "mode update times the optimizer step that follows a backward pass: add "
            "--backward (backward=True)"
        )
    for name, value, least, most in (
        ("layers", layers, 1, MAX_LAYERS), ("width", width, 8, MAX_WIDTH),
        ("tokens", tokens, 1, MAX_TOKENS), ("samples", samples, 1, MAX_SAMPLES),
    ):  # fmt: skip
        count(value, name, least, most)
    checked_lookahead(lookahead)
    if width % 8:
        raise InvalidRequestError(f"width {width}: give a multiple of 8 (bf16 matrices)")
    return ("hbm", *[m for m in MODES[1:] if m in modes])


def default_modes(backward: bool) -> tuple[str, ...]:
    """The modes run when none are named: the streaming ones, and with the backward
    pass the update too."""
    return STREAMING + (("update",) if backward else ())


def offload_steps(
    gpu: GpuDevice,
    pairs: Sequence[Pair],
    *,
    modes: Sequence[str] | None = None,
    layers: int = LAYERS,
    width: int = WIDTH,
    tokens: int = TOKENS,
    lookahead: int = 1,
    backward: bool = False,
    samples: int | None = None,
) -> list[OffloadResult]:
    """The stack from each pair's tier, every mode (None: ``default_modes``); the hbm
    result first."""
    samples = samples or default(SAMPLES, 2)
    modes = default_modes(backward) if modes is None else modes
    run = check_offload(modes, layers, width, tokens, lookahead, samples, backward)
    torch = import_torch("bench offload")
    layer_bytes = 2 * width * width
    for p in pairs:
        copies = layers * layer_bytes * (2 if "pinned" in run or "to" in run else 1)
        state = layers * width * width * 16 if "update" in run else 0  # fp32 x3, bf16 x2
        p.check_fits(max(copies + layer_bytes, state))
    ctx = GpuContext.of(gpu)
    dev = torch.device("cuda", ctx.ordinal)  # CUDA's number for it, as torch's
    torch.cuda.set_device(dev)
    stack = _Stack(torch, dev, layers, width, tokens)
    free = ctx.free_memory()
    if layers * layer_bytes * 2 > free:
        raise InvalidRequestError(
            f"{layers} layers of {layer_bytes} bytes do not fit in {gpu.name}'s free "
            f"memory twice (the hbm reference and its gradients): give fewer --layers"
        )
    hbm_times = stack.time(stack.hbm_step(backward), samples)
    out: list[OffloadResult] = []
    common = dict(initiator=gpu.target_name, gpu=gpu.name, layers=layers, width=width,
                  tokens=tokens, layer_bytes=layer_bytes, backward=backward,
                  samples=samples)  # fmt: skip
    compute_s = statistics.median(hbm_times)
    for p in pairs:
        h2d, d2h, bidir = stack.pinned_bandwidth(ctx, p.node)
        grads = layers * layer_bytes if backward else 0
        moved = {"to": (layers * layer_bytes, grads), "pinned": (layers * layer_bytes, grads)}
        bound = max(compute_s, link_time(stream_copies(layers, backward) * layer_bytes, grads,
                                         h2d, d2h, bidir))  # fmt: skip
        figures: dict[str, Any] = dict(
            compute_s=compute_s, pinned_h2d_bytes_per_s=h2d, pinned_d2h_bytes_per_s=d2h,
            pinned_bidir_bytes_per_s=bidir, bound_s=bound,
        )  # fmt: skip
        if p is pairs[0]:
            out.append(_result("hbm", hbm_times, None, figures, common, bytes_=(0, 0)))
        for mode in run[1:]:
            if mode == "update":
                out.append(_update_result(stack, ctx, p, figures, common, samples))
                continue
            times, pages, extra = stack.host_mode(mode, ctx, p.node, backward, lookahead, samples)
            to_dev, to_host = extra or moved[mode]
            copy_s = link_time(to_dev, to_host, h2d, d2h, bidir)
            step = statistics.median(times)
            hidden = min(1.0, max(0.0, 1 - max(0.0, step - compute_s) / copy_s)) if copy_s else None
            out.append(_result(mode, times, p, figures, common, pages=pages, hidden=hidden,
                               lookahead=lookahead if mode == "pycxl" else None,
                               bytes_=(to_dev, to_host)))  # fmt: skip
    return out


def offload_together(
    gpus: Sequence[GpuDevice],
    pairs: Sequence[Pair],
    *,
    layers: int = LAYERS,
    width: int = WIDTH,
    tokens: int = TOKENS,
    lookahead: int = 1,
    backward: bool = False,
    samples: int | None = None,
) -> list[OffloadResult]:
    """Every GPU of ``gpus`` streaming the stack from one tier at the same time (a
    thread each, timed steps started together), after each GPU alone: per tier, the
    alone results (hbm and pycxl, with each GPU's own bound), then one result per GPU
    with ``at_once`` GPUs and ``alone_s``, its step alone (step / alone: the cost of
    sharing the tier and the host's links)."""
    samples = samples or default(SAMPLES, 2)
    check_offload(("pycxl",), layers, width, tokens, lookahead, samples)
    out: list[OffloadResult] = []
    for p in pairs:
        alone = {g.index: offload_steps(g, [p], modes=("pycxl",), layers=layers, width=width,
                                        tokens=tokens, lookahead=lookahead, backward=backward,
                                        samples=samples) for g in gpus}  # fmt: skip
        for results in alone.values():
            out += results
        timed = _at_once(gpus, p, layers, width, tokens, lookahead, backward, samples)
        for g in gpus:
            (_, mine) = alone[g.index]
            times, pages, moved = timed[g.index]
            assert moved is not None
            out.append(dataclasses.replace(
                mine, step_s=statistics.median(times), step_s_best=min(times),
                vs_bound=statistics.median(times) / mine.bound_s, at_once=len(gpus),
                alone_s=mine.step_s, pages_on_node=pages[0], pages=pages[1],
                bytes_to_device=moved[0], bytes_to_host=moved[1],
                link_bytes_per_s=moved[0] / statistics.median(times) if moved[0] else None,
                hidden=None,
            ))  # fmt: skip
    return out


def _at_once(gpus: Sequence[GpuDevice], p: Pair, layers: int, width: int, tokens: int,
             lookahead: int, backward: bool, samples: int) -> dict[int, Timing]:  # fmt: skip
    """Each GPU's pycxl Timing, all streaming from ``p`` together (a thread each; the
    timed steps start at one barrier)."""
    import threading

    start = threading.Barrier(len(gpus))
    timed: dict[int, Timing] = {}
    failed: list[BaseException] = []

    def ready() -> None:
        start.wait()

    def run(g: GpuDevice) -> None:
        try:
            torch = import_torch("bench offload")
            ctx = GpuContext.of(g)
            dev = torch.device("cuda", ctx.ordinal)  # CUDA's number for it, as torch's
            torch.cuda.set_device(dev)
            stack = _Stack(torch, dev, layers, width, tokens)
            timed[g.index] = stack.host_mode("pycxl", ctx, p.node, backward, lookahead,
                                             samples, ready)  # fmt: skip
        except BaseException as e:  # said in the caller's thread
            failed.append(e)
            start.abort()

    threads = [threading.Thread(target=run, args=(g,)) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:  # the first error that is not another thread's broken barrier
        raise next((e for e in failed if not isinstance(e, threading.BrokenBarrierError)),
                   failed[0])  # fmt: skip
    return timed


def stream_copies(layers: int, backward: bool, buffers: int = 2) -> int:
    """Layer copies per step that streaming through ``buffers`` device buffers cannot
    avoid, steps following each other: a forward pass copies every layer (none, if
    all fit); forward+backward uses each layer twice, and the ``buffers`` layers at each
    turn (forward to backward, backward to the next step) are still there."""
    if backward:
        return max(0, 2 * layers - 2 * buffers)
    return layers if layers > buffers else 0


def link_time(to_device: int, to_host: int, h2d: float, d2h: float, bidir: float) -> float:
    """The least time the link needs for a step: without gradients, the weights over
    the h2d bandwidth; with them (``to_host``), half the weights come in during the
    forward pass alone, and the other half during the backward pass while the gradients
    go out, at what the link carries both ways at once."""
    if not to_host:
        return to_device / h2d
    half = to_device / 2
    return half / h2d + max(half / h2d, to_host / d2h, (half + to_host) / bidir)


def _result(mode: str, times: list[float], p: Pair | None, figures: dict[str, Any],
            common: dict[str, Any], *, bytes_: tuple[int, int],
            pages: tuple[int, int] | None = None, hidden: float | None = None,
            lookahead: int | None = None) -> OffloadResult:  # fmt: skip
    step = statistics.median(times)
    on_host = p is not None
    return OffloadResult(
        target=p.target.name if p else common["initiator"], node=p.node if p else None, pair=p,
        cpus=(), size=common["layers"] * common["layer_bytes"], page_size=4096 if on_host else 0,
        pages_on_node=pages[0] if pages else None, pages=pages[1] if pages else None,
        mode=mode, lookahead=lookahead, step_s=step, step_s_best=min(times),
        bytes_to_device=bytes_[0], bytes_to_host=bytes_[1],
        vs_bound=step / figures["bound_s"], hidden=hidden,
        link_bytes_per_s=bytes_[0] / step if bytes_[0] else None, **figures, **common,
    )  # fmt: skip


def _update_result(stack: _Stack, ctx: GpuContext, p: Pair, figures: dict[str, Any],
                   common: dict[str, Any], samples: int) -> OffloadResult:  # fmt: skip
    """Mode update: the optimizer step's times against the bound of the plan made at
    set-up (its split, from each side's rate alone)."""
    times, pages, first = stack.update_steps(ctx, p, samples)
    if first.predicted_s is None or not first.cpu_rate or not first.gpu_rate:
        raise OperationError(f"the update's plan measured no rates: {first}")
    own = dict(figures, bound_s=first.predicted_s)
    result = _result("update", times, p, own, common, pages=pages, bytes_=(0, 0))
    return dataclasses.replace(
        result, update_cpu_blocks=first.cpu, update_gpu_blocks=first.gpu,
        update_cpu_rate=first.cpu_rate, update_gpu_rate=first.gpu_rate,
    )  # fmt: skip


class _Stack:
    """The layers' weights (made on the GPU from a fixed seed) and the steps of each mode."""

    def __init__(self, torch: Any, dev: Any, layers: int, width: int, tokens: int) -> None:
        self.torch, self.dev, self.layers, self.width = torch, dev, layers, width
        g = torch.Generator(device=dev).manual_seed(0)
        self.x = torch.randn(tokens, width, device=dev, dtype=torch.bfloat16, generator=g)
        self._seed = 1

    def weight(self, i: int) -> Any:
        """Layer ``i``'s weights, on the GPU (the same for every mode)."""
        torch = self.torch
        g = torch.Generator(device=self.dev).manual_seed(self._seed + i)
        w = torch.randn(self.width, self.width, device=self.dev, dtype=torch.float32, generator=g)
        return (w / self.width**0.5).to(torch.bfloat16)

    def time(self, step: Callable[[], None], samples: int,
             ready: Callable[[], None] | None = None) -> list[float]:  # fmt: skip
        """Host seconds of each of ``samples`` steps, after WARMUP untimed ones and,
        when given, ``ready()`` (other GPUs' threads meet there to start at once)."""
        sync = self.torch.cuda.synchronize
        for _ in range(WARMUP):
            step()
        sync()
        if ready is not None:
            ready()
        times = []
        for _ in range(samples):
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        return times

    def _finish(self, h: Any, backward: bool) -> None:
        if backward:
            h.float().square().mean().backward()

    def hbm_step(self, backward: bool) -> Callable[[], None]:
        torch = self.torch
        ws = [self.weight(i).requires_grad_(backward) for i in range(self.layers)]

        def step() -> None:
            with torch.set_grad_enabled(backward):
                h = self.x
                for w in ws:
                    h = torch.relu(torch.nn.functional.linear(h, w))
                self._finish(h, backward)
            for w in ws:
                w.grad = None

        return step

    def pinned_bandwidth(self, ctx: GpuContext, node: int) -> tuple[float, float, float]:
        """Pinned copy bandwidth between the tier and the GPU (best of the samples): to
        the device, to the host, and both at once (the sum, on two streams)."""
        torch = self.torch
        nbytes = 2 * self.width * self.width * min(self.layers, 4)
        # the pair's check_fits counted these: no second read of the node's memory
        hosts = [HostMemory.owning(ctx, NumaBuffer(nbytes, Policy.bind(node))) for _ in range(2)]
        t: list[Any] = [torch.from_numpy(h.array("uint8")) for h in hosts]
        t += [torch.empty(nbytes, dtype=torch.uint8, device=self.dev) for _ in range(2)]
        streams = [torch.cuda.Stream(self.dev) for _ in range(2)]

        def both() -> None:
            for s, (dst, src) in zip(streams, ((2, 0), (1, 3)), strict=True):
                s.wait_stream(torch.cuda.current_stream(self.dev))
                with torch.cuda.stream(s):
                    t[dst].copy_(t[src], non_blocking=True)
            for s in streams:
                torch.cuda.current_stream(self.dev).wait_stream(s)

        try:
            h2d = functools.partial(t[2].copy_, t[0], non_blocking=True)
            d2h = functools.partial(t[1].copy_, t[3], non_blocking=True)
            # best of the samples: a bound is what the link can do at its best
            figures = [nbytes / min(self.time(copy, COPY_SAMPLES)) for copy in (h2d, d2h)]
            figures.append(2 * nbytes / min(self.time(both, COPY_SAMPLES)))
            del h2d, d2h
            return figures[0], figures[1], figures[2]
        finally:
            t.clear()  # the host memory's views go before it is freed
            for h in hosts:
                h.close()

    def host_mode(self, mode: str, ctx: GpuContext, node: int, backward: bool, lookahead: int,
                  samples: int, ready: Callable[[], None] | None = None) -> Timing:  # fmt: skip
        """One host mode's Timing."""
        if mode == "pycxl":
            return self._streamed(ctx, node, backward, lookahead, samples, ready)
        return self._copied(ctx, node, backward, samples, pinned=mode == "pinned")

    def _streamed(self, ctx: GpuContext, node: int, backward: bool, lookahead: int,
                  samples: int, ready: Callable[[], None] | None = None) -> Timing:  # fmt: skip
        from ..gpu.cuda_engine import CudaEngine
        from ..torch.offload.host_memory import tier_allocator
        from ..torch.offload.layers import LayerOffload

        torch = self.torch
        linears = []
        for i in range(self.layers):
            lin = torch.nn.Linear(self.width, self.width, bias=False, device="meta",
                                  dtype=torch.bfloat16)  # fmt: skip
            lin.weight = torch.nn.Parameter(self.weight(i).cpu(), requires_grad=backward)
            linears.append(lin)
        alloc = tier_allocator([node], ctx, room_checked=True)  # check_fits counted it
        offload = LayerOffload(linears, alloc, engine=CudaEngine(ctx), device=self.dev,
                               weights="stream", lookahead=lookahead)  # fmt: skip
        model = torch.nn.Sequential(*[m for lin in linears for m in (lin, torch.nn.ReLU())])
        counted: list[tuple[int, int]] = []

        def step() -> None:
            with torch.set_grad_enabled(backward):
                self._finish(model(self.x), backward)
            offload.synchronize()  # the gradients have landed on the tier
            for lin in linears:
                lin.weight.grad = None  # the loop's zero_grad: each pass's own gradients
            st = offload.stats()
            counted.append((st.bytes_to_device, st.bytes_to_host))

        try:
            times = self.time(step, samples, ready)
            (d0, h0), (d1, h1) = counted[WARMUP - 1], counted[-1]  # around the timed steps
            moved = ((d1 - d0) // samples, (h1 - h0) // samples)
            return times, _on_node(offload.pages_by_node(), node), moved
        finally:
            offload.close()

    def update_steps(
        self, ctx: GpuContext, p: Pair, samples: int
    ) -> tuple[list[float], tuple[int, int], Any]:
        """The optimizer step over the layers (their gradients from one backward
        pass) with the state on ``p``'s node, waited for each time, the split as set up
        (not moved by the steps' timings): its times, the state's pages, the plan."""
        from ..gpu.cuda_engine import CudaEngine
        from ..torch.offload.host_memory import tier_allocator
        from ..torch.offload.model import ModelOffload

        torch = self.torch
        model = torch.nn.Sequential(*[
            torch.nn.Linear(self.width, self.width, bias=False, device=self.dev,
                            dtype=torch.bfloat16)
            for _ in range(self.layers)
        ])  # fmt: skip
        with torch.no_grad():
            for i, lin in enumerate(model):
                lin.weight.copy_(self.weight(i))
        offload = ModelOffload(
            model, tier_allocator([p.node], ctx, room_checked=True), device=self.dev,
            engine=CudaEngine(ctx),
            cpus=p.cpus, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-6),
            blocks=list(model), overlap=False,
        )  # fmt: skip
        try:
            first = offload.plan()
            offload.set_plan(gpu=first.gpu)  # the bound's split, timed as it is
            h = self.x
            for lin in model:
                h = torch.relu(lin(h))
            self._finish(h, True)  # the gradients every step updates from
            times = self.time(offload.optimizer.step, samples)
            return times, _on_node(offload.pages_by_node(), p.node), first
        finally:
            offload.close()

    def _host_weight(self, mem: Any, i: int) -> Any:
        """Layer ``i``'s weights written into host memory ``mem``, as a tensor on it."""
        t = self.torch.from_numpy(mem.array("uint8")).view(self.torch.bfloat16)
        return t.view(self.width, self.width).copy_(self.weight(i))

    def _copied(self, ctx: GpuContext, node: int, backward: bool, samples: int, *,
                pinned: bool) -> Timing:  # fmt: skip
        from ..numa.pages import pages_by_node

        torch = self.torch
        owners: list[Any] = []
        hosts = []
        nbytes = 2 * self.width * self.width
        for i in range(self.layers):
            mem: Any = NumaBuffer(nbytes, Policy.bind(node))  # counted by check_fits
            if pinned:
                mem = HostMemory.owning(ctx, mem)
            owners.append(mem)
            hosts.append(self._host_weight(mem, i).requires_grad_(backward))
        try:

            def step() -> None:
                with torch.set_grad_enabled(backward):
                    h = self.x
                    for w in hosts:
                        h = torch.relu(torch.nn.functional.linear(
                            h, w.to(self.dev, non_blocking=pinned)))  # fmt: skip
                    self._finish(h, backward)
                for w in hosts:
                    w.grad = None

            times = self.time(step, samples)
            counts: dict[int, int] = {}
            for mem in owners:
                for k, v in pages_by_node(mem).items():
                    counts[k] = counts.get(k, 0) + v
            return times, _on_node(counts, node), None
        finally:
            hosts.clear()  # the host memory's views go before it is freed
            for mem in owners:
                mem.close()


def _on_node(counts: dict[int, int], node: int) -> tuple[int, int]:
    return counts.get(node, 0), sum(counts.values())
