"""The public facade: the library by name. Memory on tiers, regions with their tier, host
memory for GPUs.

These take what users type (``"cxl0"``, ``"dram0,cxl0"``, ``"gpu0"``, sizes such as
``"256M"``), resolve it against one snapshot (``system``, read when not given) and call
the floors below, which take ids. ``import pycxl`` exposes each of them.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..base.errors import InvalidRequestError
from ..base.values import ascii_digits, count, flag, instance, items, size as checked_size
from ..cxl import regions as _regions
from ..resolve.system import System, given_or_read, snapshot

if TYPE_CHECKING:
    import numpy as np

    from ..cxl.dax import DaxMapping
    from ..cxl.model import Region
    from ..cxl.region_layout import RegionRequest
    from ..cxl.regions import RegionResult
    from ..gpu.memory import HostMemory
    from ..gpu.tier_pool import TierPool
    from ..numa.longterm import PinnedPlacement
    from ..numa.placement import HugePages, NumaBuffer
    from ..numa.policy import Policy
    from ..torch.offload import model as model_offload
    from ..torch.offload.fit import Fit
    from ..torch.offload.layers import LayerOffload, Weights
    from ..torch.offload.model import ModelOffload

Names = str | int | Iterable[str | int]


def _bytes(size: int | str) -> int:
    return checked_size(size)  # the one size checker, as the CLI's


def allocate(
    size: int | str,
    target: Names | None = None,
    *,
    policy: Policy | None = None,
    huge: HugePages = "auto",
    populate: bool = True,
    system: System | None = None,
) -> NumaBuffer:
    """``size`` bytes on ``target`` (``"cxl0"``, ``"dram0,cxl0"``, a node id), or under
    ``policy``; first touched there unless ``populate=False``.

    >>> buf = pycxl.allocate("64M", "cxl0")
    >>> buf.pages_by_node()                     # {1: 16384}
    """
    from ..numa import placement
    from ..numa.policy import Policy

    if (target is None) == (policy is None):
        raise InvalidRequestError("give a target or a policy (one of them)")
    if policy is not None:
        instance(policy, Policy, "policy", "a pycxl.Policy, such as Policy.bind(0)")
    s = given_or_read(system, gpus=False)
    nodes = s.placement_nodes(target) if target is not None else None
    return placement.allocate(_bytes(size), nodes, policy=policy, huge=huge, populate=populate)


def migrate(obj: Any, target: str | int, *, system: System | None = None) -> dict[int, int]:
    """Move the pages of a NumaBuffer, numpy array or other buffer to ``target``'s node
    (a NumaBuffer's later faults follow too); pages per node afterwards."""
    from ..numa import placement

    nodes = given_or_read(system, gpus=False).placement_nodes(target)
    if len(nodes) != 1:
        raise InvalidRequestError(f"migrate to one node, not {len(nodes)} ({target})")
    if isinstance(obj, placement.NumaBuffer):
        return obj.migrate(nodes)
    return placement.migrate(obj, nodes[0])


def host_memory(
    size: int | str,
    target: Names,
    gpu: str = "gpu0",
    *,
    huge: HugePages = "auto",
    allow_migration: bool = False,
    system: System | None = None,
) -> HostMemory:
    """``size`` bytes on ``target``, touched there, pinned and mapped for ``gpu``
    (zero-copy and DMA); ``close()`` unregisters and frees them. Pages the pin moved
    off the target (a CXL node onlined movable) are a PlacementError, unless
    ``allow_migration`` (then ``.placement`` says where they went)."""
    from ..gpu.context import GpuContext
    from ..gpu.memory import HostMemory

    s = given_or_read(system)
    nodes = s.placement_nodes(target)
    ctx = GpuContext.of(s.gpu(gpu))
    return HostMemory.allocate(ctx, _bytes(size), nodes, huge=huge,
                               allow_migration=allow_migration)  # fmt: skip


@dataclass(frozen=True)
class PinProbe:
    """What a long-term pin did to memory on one tier (``probe_longterm_pins``)."""

    tier: str
    node: int
    zone: str | None  # CXL memory's zone, where known
    placement: PinnedPlacement

    @property
    def holds(self) -> bool:
        """Whether the tier kept every pinned page."""
        return self.placement.stayed


def probe_longterm_pins(
    targets: Names | None = None, *, size: int | str = "2M", system: System | None = None
) -> list[PinProbe]:
    """For each tier (default: every node with memory), place ``size`` bytes there, take
    a long-term pin on them (io_uring fixed buffers: the pin GPU registration takes) and
    report where the pages are afterwards. Nothing is left pinned or allocated."""
    from ..numa import placement

    s = given_or_read(system, gpus=False)
    nodes = s.placement_nodes(targets if targets is not None else "all")
    out = []
    for node in nodes:
        tier = s.tier(node)
        assert tier is not None
        with placement.allocate(_bytes(size), [node]) as buf:
            out.append(PinProbe(tier.name, node, tier.zone, _pin_and_count(buf)))
    return out


def _pin_and_count(buf: NumaBuffer) -> PinnedPlacement:
    from ..numa.longterm import LongtermPin, pin_placement

    pins: list[LongtermPin] = []
    try:
        return pin_placement(buf, lambda: pins.append(LongtermPin(buf)))
    finally:
        for pin in pins:
            pin.close()


class _PinnedOwner:
    """Owns a HostMemory for the arrays and tensors made on it: numpy keeps this object
    as the array's base, so the registration lives exactly as long as the last view."""

    def __init__(self, host: HostMemory, nbytes: int) -> None:
        self.host = host
        self.__array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (host.address, False), "version": 3,
        }  # fmt: skip


def _shape(shape: object) -> tuple[int, ...]:
    """An array shape: a whole number or a sequence of them, none negative."""
    dims = (shape,) if isinstance(shape, int) else shape
    if not isinstance(dims, tuple | list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims
    ):  # fmt: skip
        raise InvalidRequestError(f"shape {shape!r}: give a whole number or a tuple of them")
    return tuple(dims)


def pinned_array(
    shape: int | tuple[int, ...],
    dtype: Any,
    target: Names,
    gpu: str = "gpu0",
    *,
    huge: HugePages = "auto",
    allow_migration: bool = False,
    system: System | None = None,
) -> np.ndarray:
    """A numpy array of ``shape`` and ``dtype`` whose memory is on ``target``, pinned and
    registered for ``gpu`` (DMA at pinned speed, zero-copy reads); unregistered and freed
    when the last array or view of it goes."""
    import numpy as np

    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        raise InvalidRequestError(
            f"dtype {dtype!r}: give a numpy dtype, such as 'float32'"
        ) from None
    dims = _shape(shape)
    nbytes = math.prod(dims) * dt.itemsize
    if nbytes <= 0:
        raise InvalidRequestError(f"shape {dims} holds no element")
    host = host_memory(nbytes, target, gpu, huge=huge, allow_migration=allow_migration,
                       system=system)  # fmt: skip
    raw: np.ndarray = np.asarray(_PinnedOwner(host, nbytes))
    shaped: np.ndarray = raw.view(dt).reshape(dims)
    return shaped


def pinned_tensor(
    shape: int | tuple[int, ...],
    dtype: Any,
    target: Names,
    gpu: str = "gpu0",
    *,
    huge: HugePages = "auto",
    allow_migration: bool = False,
    system: System | None = None,
) -> Any:
    """A CPU ``torch.Tensor`` of ``shape`` and ``dtype`` (a torch dtype) whose memory is
    on ``target``, pinned and registered for ``gpu``: PyTorch treats it as pinned
    (``is_pinned()``; ``non_blocking`` copies by DMA), and it is unregistered and freed
    with the tensor. PyTorch is needed only here."""
    from ..torch._import import import_torch

    torch = import_torch("pinned_tensor")
    if not isinstance(dtype, torch.dtype):
        raise InvalidRequestError(f"dtype {dtype!r}: give a torch dtype, such as torch.float32")
    if torch.cuda.is_available():
        # PyTorch says a tensor is pinned only once its own CUDA state exists
        torch.cuda.current_device()
    dims = _shape(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = 1
    for d in dims:
        count *= d
    raw = pinned_array(count * itemsize, "uint8", target, gpu, huge=huge,
                       allow_migration=allow_migration, system=system)  # fmt: skip
    return torch.from_numpy(raw).view(dtype).view(dims)


def offload_layers(
    layers: Iterable[Any],
    target: Names,
    gpu: str | None = "gpu0",
    *,
    weights: Weights = "stream",
    lookahead: int = 1,
    optimizer: Callable[[list[Any]], Any] | None = None,
    huge: HugePages = "auto",
    system: System | None = None,
) -> LayerOffload:
    """A model's ``layers`` (torch modules run in order) with their weights on
    ``target``, streamed to ``gpu`` as they run (``weights="stream"``: the GPU holds
    ``lookahead + 1`` layers at a time), or kept on the GPU (``"resident"``); with an
    ``optimizer`` (an Adam or AdamW factory: ``functools.partial(torch.optim.Adam, lr=...,
    fused=True)``; ``pycxl.torch.offload.layers.default_optimizer``), the fp32 master weights
    and the optimizer's moments stay on ``target`` and each layer is updated on the CPU
    as soon as its gradients arrive, while the GPU goes on with the backward pass.
    ``gpu=None`` trains on the CPU with the parameters and state on ``target``.

    >>> offload = pycxl.offload_layers(model.layers, "cxl0", "gpu0")
    >>> model(x)                                   # each layer copied in ahead of use
    >>> offload.pages_by_node()                    # {1: 524288}: counted, not assumed
    """
    from ..base.values import lookahead as checked_lookahead
    from ..gpu.cuda_engine import CudaEngine
    from ..gpu.host_engine import HostEngine
    from ..torch._import import import_torch
    from ..torch.offload.host_memory import tier_allocator
    from ..torch.offload.layers import LayerOffload

    torch = import_torch()
    lookahead = checked_lookahead(lookahead)  # the one rule every ring keeps
    s = given_or_read(system, gpus=gpu is not None)
    nodes = s.placement_nodes(target)  # a bad name fails here, before any memory is taken
    engine: Any
    ctx = None
    if gpu is None:
        engine, device = HostEngine(), torch.device("cpu")
        if weights == "stream":
            raise InvalidRequestError(
                "weights='stream' streams to a GPU: name one (gpu='gpu0'), or use "
                "weights='resident' to train on the CPU with the parameters on the tier"
            )
    else:
        from ..gpu.context import GpuContext

        found = s.gpu(gpu)
        torch.cuda.current_device()  # PyTorch's CUDA state first (pinned_tensor says why)
        ctx = GpuContext.of(found)
        engine, device = CudaEngine(ctx), torch.device("cuda", ctx.ordinal)
    layers = items(layers, "layers", "a list of the model's layers (model.model.layers)")
    return LayerOffload(layers, tier_allocator(nodes, ctx, huge), engine=engine,
                        device=device, weights=weights, lookahead=lookahead,
                        optimizer=optimizer, cpus=_tier_cpus(s, nodes))  # fmt: skip


def _tier_cpus(s: System, nodes: Iterable[int]) -> list[int]:
    """The CPUs of the socket nearest the tier that this process may use (the CPU
    Adam step's threads), or all it may use where that socket has none of them."""
    allowed = os.sched_getaffinity(0)
    near = s.nearest_cpu_node(next(iter(nodes))).node.cpus
    return [c for c in near if c in allowed] or sorted(allowed)


def offload_model(
    model: Any,
    target: Names,
    gpu: str | None = "gpu0",
    *,
    optimizer: Any,
    weights: model_offload.Weights = "resident",
    blocks: Iterable[Any] | None = None,
    update: model_offload.Update = "auto",
    lookahead: int = 1,
    overlap: bool = True,
    update_in_backward: bool = False,
    hbm_blocks: int = 0,
    weights_from: str | os.PathLike[str] | None = None,
    initialise: bool = False,
    cpus: Iterable[int] | None = None,
    huge: HugePages = "auto",
    system: System | None = None,
) -> ModelOffload:
    """Train ``model`` (on ``gpu``; ``None``: on the CPU) with the fp32 master weights
    and Adam moments of its repeated blocks (a transformer's layers, found, or given as
    ``blocks``) on ``target``; with ``weights="stream"`` the blocks' weights and
    gradients live there too and visit the GPU only while their block runs (a model
    larger than HBM: build it on the CPU, the rest of it is moved to the GPU), with
    ``"resident"`` they stay on the GPU. ``optimizer`` is a torch Adam or AdamW over the
    model's parameters (or a factory taking them); use ``.optimizer`` of the result in
    its place: its ``step()`` updates each block on the CPU (threads on the tier's
    socket: half of its CPUs where the GPU updates too; or ``cpus``) or on the GPU (state
    streamed through), split so both finish
    together (``update="auto"``; ``"cpu"``, ``"gpu"`` to choose), and with ``overlap``
    returns while the update runs beside the next forward pass; with
    ``update_in_backward`` the CPU side begins in the backward pass where the loop's
    habits (learned from its first step: accumulation, clipping) leave the result
    PyTorch's. ``hbm_blocks``: the first blocks keep their state in the GPU's memory
    and are updated there (streamed: their weights stay there too; ``pycxl.fit``'s
    ``chosen.hbm_blocks`` is as many as its HBM holds beside a step). ``.plan()``
    shows the split. A tier with less free memory than it would place there is refused
    before any is taken (``pycxl.fit`` says which placement fits where).
    ``weights_from``: a safetensors checkpoint (a file, or the folder ``save_pretrained``
    wrote) whose values each parameter takes where it lives, read one tensor at a time:
    a model built on the ``meta`` device (larger than HBM and host memory in fp32) is
    made straight into its placement, its fp32 master from the file's precision.
    ``initialise``: a model built on ``meta`` is made by its own initialisation instead
    (``reset_parameters``, then a transformers model's ``_init_weights``), one module at
    a time on the device it trains on, and each value taken where it lives.

    >>> adamw = torch.optim.AdamW(model.parameters(), lr=1e-4)
    >>> off = pycxl.offload_model(model, "cxl0", "gpu0", optimizer=adamw)
    >>> model(**batch).loss.backward(); off.optimizer.step(); off.optimizer.zero_grad()
    >>> off.pages_by_node()                        # {1: 2621440}: counted, not assumed
    """
    from ..gpu.cuda_engine import CudaEngine
    from ..gpu.host_engine import HostEngine
    from ..torch._import import import_torch
    from ..torch.offload.checkpoint import WeightSource
    from ..torch.offload.config import MAX_BLOCKS
    from ..torch.offload.fit import check_tier_room
    from ..torch.offload.host_memory import tier_allocator
    from ..torch.offload.initialise import ModelInit
    from ..torch.offload.model import ModelOffload
    from ..torch.offload.train_shape import TrainShape

    torch = import_torch()
    # the modes (lookahead too) are checked once, by the offload's OffloadConfig, before
    # any memory is taken
    s = given_or_read(system, gpus=gpu is not None)
    nodes = s.placement_nodes(target)  # a bad name fails here, before any memory is taken
    if blocks is not None:
        blocks = items(blocks, "blocks", "a list of the model's blocks (model.model.layers)")
    if not isinstance(initialise, bool):
        raise InvalidRequestError(f"initialise {initialise!r}: give True or False")
    if initialise and weights_from is not None:
        raise InvalidRequestError(
            "give weights_from (a checkpoint's values) or initialise=True (the model's own "
            "initialisation), not both"
        )
    source: Any = None if weights_from is None else WeightSource.open(weights_from)
    tier, free = _tier_room(s, nodes)
    hbm_blocks = count(hbm_blocks, "hbm_blocks", 0, MAX_BLOCKS)
    check_tier_room(TrainShape.of_model(model, blocks), streamed=weights == "stream",
                    on_gpu=gpu is not None, free=free, tier=tier,
                    hbm_blocks=hbm_blocks)  # fmt: skip
    if cpus is not None:
        chosen = list(s.cpus([str(c) for c in cpus]))
    else:
        chosen = _tier_cpus(s, nodes)
        if gpu is not None and update == "auto":
            # the host's memory bounds the update, not the CPU's cores: half the socket
            # updates as fast beside the GPU side's copies and leaves cores to the rest of
            # the job (H200 host, 1B Llama: 208 against 215 ms a step with all 16)
            chosen = chosen[: max(1, len(chosen) // 2)]
    engine: Any
    ctx = None
    if gpu is None:
        engine, device = HostEngine(), torch.device("cpu")
    else:
        from ..gpu.context import GpuContext

        found = s.gpu(gpu)
        torch.cuda.current_device()  # PyTorch's CUDA state first (pinned_tensor says why)
        ctx = GpuContext.of(found)
        engine, device = CudaEngine(ctx), torch.device("cuda", ctx.ordinal)
    if initialise:
        source = ModelInit(device)
    return ModelOffload(model, tier_allocator(nodes, ctx, huge), device=device, engine=engine,
                        cpus=chosen, optimizer=optimizer, blocks=blocks, update=update,
                        weights=weights, lookahead=lookahead, overlap=overlap,
                        update_in_backward=update_in_backward,
                        hbm_blocks=hbm_blocks, weights_from=source)  # fmt: skip


def fit(
    model: Any,
    target: Names,
    gpu: str | None = "gpu0",
    *,
    tokens: int,
    seq: int | None = None,
    lookahead: int = 1,
    accumulation: int = 1,
    update_in_backward: bool = False,
    hbm_free: int | str | None = None,
    tier_free: int | str | None = None,
    link: float | None = None,
    cpu_update: float | None = None,
    gpu_flops: float | None = None,
    system: System | None = None,
) -> Fit:
    """Whether ``model`` (a torch model, ``meta`` device included, or a ``TrainShape``)
    trains under ``offload_model`` with its state on ``target`` and ``gpu``, for steps
    of ``accumulation`` micro-batches of ``tokens`` (sequences of ``seq``): the bytes
    each placement puts in HBM and on the
    tier, which fit, and the step's bound, before any of its memory is taken. What is
    not given is read or measured here: the tier's free memory, HBM's free memory, the
    link's and the GPU's rates (``gpu=None``: no GPU here; give ``hbm_free`` and, for a
    step time, ``link`` and ``gpu_flops``), the CPU update's rate on the tier (measured
    on ``target``'s memory even where ``tier_free`` plans for more of it than is here).
    ``update_in_backward``: as offload_model's, for a loop that does not clip (the
    update then runs beside the backward pass; otherwise it begins at ``step()``).

    >>> plan = pycxl.fit(model, "dram0", tokens=4096)
    >>> print(plan.why)         # fits: weights resident, a step at least 412 ms (...)
    """
    from ..base.values import finite
    from ..torch.offload import fit as planning, fit_machine
    from ..torch.offload.host_memory import tier_allocator
    from ..torch.offload.train_shape import TrainShape

    tokens, seq, lookahead, accumulation = planning.checked_step(tokens, seq, lookahead,
                                                                 accumulation)  # fmt: skip
    early = flag(update_in_backward, "update_in_backward")
    for what, rate in (("link", link), ("cpu_update", cpu_update), ("gpu_flops", gpu_flops)):
        if rate is not None:
            finite(rate, what, 0.0, planning.MAX_RATE)
    hbm = None if hbm_free is None else _bytes(hbm_free)
    shape = model if isinstance(model, TrainShape) else TrainShape.of_model(model)
    if gpu is None and hbm is None:
        raise InvalidRequestError("without a GPU here, give hbm_free: the GPU's free memory")
    s = given_or_read(system, gpus=gpu is not None)
    nodes = s.placement_nodes(target)  # a bad name fails here, before anything is measured
    tier, free = _tier_room(s, nodes)
    free = free if tier_free is None else _bytes(tier_free)
    ctx = device = None
    if gpu is not None:
        from ..gpu.context import GpuContext
        from ..torch._import import import_torch

        found = s.gpu(gpu)
        torch = import_torch()
        torch.cuda.current_device()  # PyTorch's CUDA state first (pinned_tensor says why)
        ctx = GpuContext.of(found)
        device = torch.device("cuda", ctx.ordinal)
    machine = fit_machine.read_machine(
        tier, free, tier_allocator(nodes, ctx), _tier_cpus(s, nodes), device,
        hbm_free=hbm, link=link, cpu_update=cpu_update, flops=gpu_flops,
    )  # fmt: skip
    return planning.fit(shape, machine, tokens, seq=seq, lookahead=lookahead,
                        accumulation=accumulation, update_in_backward=early)  # fmt: skip


def _tier_room(s: System, nodes: Iterable[int]) -> tuple[str, int]:
    """The tier's name (its nodes' names, joined) and its free bytes now."""
    chosen = set(nodes)
    free = sum(t.node.mem_available for t in s.nodes if t.node.id in chosen)
    return ",".join(sorted({s.tier_name(n) or f"node{n}" for n in chosen})), free


def _host(system: System | None) -> System:
    """The host a region call changes, read once: ``system`` as given, or this
    machine's, without its GPUs."""
    return given_or_read(system, gpus=False)


def _with_tier(result: RegionResult, system: System) -> RegionResult:
    if result.numa_node is None:
        return result
    # the read-back's CXL objects, not a third read; the nodes as they are now
    now = snapshot(system.sysfs(), gpus=False, cxl=result.topology)
    return dataclasses.replace(result, tier=now.tier_name(result.numa_node))


def _region(system: System, region: str | Region) -> Region:
    """A region of the one topology read: by name, or as given."""
    from ..cxl.model import Region

    if isinstance(region, str):
        return system.cxl.require().region(ascii_digits(region.strip(), "region"))
    return instance(region, Region, "region", "a region's name (region0) or a Region")


def create_region(
    request: RegionRequest,
    *,
    system: System | None = None,
    dry_run: bool = False,
) -> RegionResult:
    """Create, commit, bind and (by default) online a region; the result names its NUMA
    node and tier (``cxl0``...). See ``RegionRequest`` for what can be asked.
    ``system``: the host to change (``pycxl.snapshot()``; default: this machine)."""
    from ..cxl.region_layout import RegionRequest

    instance(request, RegionRequest, "request", "a RegionRequest, such as RegionRequest(ways=2)")
    host = _host(system)
    result = _regions.create_region(request, fs=host.sysfs(), dry_run=dry_run)
    return result if dry_run else _with_tier(result, host)


def enable_region(
    region: str | Region,
    *,
    online: bool = True,
    zone: str | None = None,
    mode: str | None = None,
    system: System | None = None,
    dry_run: bool = False,
) -> RegionResult:
    """Bind a committed region and online its memory (``zone``: normal by default; a
    region online in the other zone is moved); ``mode`` switches it between
    system-ram and devdax. The result names its tier."""
    from ..cxl.memory_blocks import check_zone

    host = _host(system)
    result = _regions.enable_region(
        _region(host, region), online=online,
        zone=check_zone(zone) if zone is not None else None, mode=mode, fs=host.sysfs(),
        dry_run=dry_run,
    )  # fmt: skip
    return result if dry_run else _with_tier(result, host)


def disable_region(
    region: str | Region,
    *,
    force: bool = False,
    system: System | None = None,
    dry_run: bool = False,
) -> RegionResult:
    """Offline the region's memory and unbind its driver; the decode stays committed."""
    host = _host(system)
    return _regions.disable_region(_region(host, region), force=force, fs=host.sysfs(),
                                   dry_run=dry_run)  # fmt: skip


def destroy_region(
    region: str | Region,
    *,
    force: bool = False,
    system: System | None = None,
    dry_run: bool = False,
) -> RegionResult:
    """Offline, disable and tear down a region; pmem needs ``force``."""
    host = _host(system)
    return _regions.destroy_region(_region(host, region), force=force, fs=host.sysfs(),
                                   dry_run=dry_run)  # fmt: skip


def map_dax(
    name: str,
    size: int | str | None = None,
    *,
    system: System | None = None,
) -> DaxMapping:
    """Map a devdax device (``dax0.0``), or the one of a region (``region0``), into this
    process: its memory, directly, as a buffer with a numpy view that
    ``pycxl.gpu.memory.HostMemory`` can register. ``size``: all of it by default, else a
    multiple of the device's alignment."""
    from ..base.errors import NotFoundError
    from ..cxl.dax import DaxMapping, read_dax_devices

    fs = given_or_read(system, gpus=False).sysfs()
    if fs.root != "/":  # its /dev/daxX.Y would be this machine's device under the tree's name
        raise InvalidRequestError(
            f"mapping {name} needs this machine, not the recorded tree {fs.root}: leave "
            "system unset"
        )
    devices = read_dax_devices(fs)
    found = [d for d in devices if name in (d.name, d.region)]
    if not found:
        raise NotFoundError("dax device", name, [d.name for d in devices])
    if len(found) > 1:
        raise InvalidRequestError(
            f"{name} has {len(found)} dax devices; name one: " + ", ".join(d.name for d in found)
        )
    return DaxMapping(found[0], None if size is None else _bytes(size))


def tier_pool(target: str | int, *, system: System | None = None) -> TierPool:
    """The CUDA memory pool on ``target``'s node (one tier: ``"cxl0"``, ``"dram0"``, a node
    id), opened once per process: GPU-addressable pinned memory on that node, checked
    there. ``.allocate(size)`` gives memory with ``__cuda_array_interface__``; ``.stats()``
    counts what it holds."""
    from ..gpu.tier_pool import open_pool

    s = given_or_read(system, gpus=False)
    nodes = s.placement_nodes(target)
    if len(nodes) != 1:
        raise InvalidRequestError(
            f"a tier pool is on one node, not {len(nodes)} ({target}): name one tier"
        )
    t = s.tier(nodes[0])
    return open_pool(nodes[0], t.name if t is not None else f"node{nodes[0]}")


def on_tier(target: str | int | TierPool, *, system: System | None = None) -> Any:
    """A ``with`` block whose CUDA tensors (those this thread allocates) are on ``target``.

    >>> with pycxl.on_tier("cxl0"):
    ...     kv = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")   # on cxl0
    """
    from ..gpu.tier_pool import TierPool
    from ..torch import tier as torch_tier

    pool = target if isinstance(target, TierPool) else tier_pool(target, system=system)
    return torch_tier.on_tier(pool)


def spill_to(
    target: str | int, *, log: bool | None = None, system: System | None = None
) -> TierPool:
    """From now on, CUDA allocations that the GPU's memory refuses land on ``target``
    instead of raising out-of-memory. Call it before the first CUDA allocation; ``log``
    (default: PYCXL_SPILL_LOG=1) logs each spill with its size and call site. Weights
    that spilled are read through HBM by copy in forward passes without gradients
    (PYCXL_SPILL_STREAM_WEIGHTS=0: in place)."""
    from ..torch import tier as torch_tier

    return torch_tier.spill_to(tier_pool(target, system=system), log_spills=log)


def move(tensor: Any, where: str | int, *, system: System | None = None) -> Any:
    """A copy of a CUDA tensor on tier ``where`` (``"cxl0"``) or in GPU ``where``'s memory
    (``"gpu0"``)."""
    from ..resolve.tiers import is_gpu_name
    from ..torch import tier as torch_tier

    torch = torch_tier.require_cuda_tensor(tensor)  # before any name or driver
    if isinstance(where, str) and is_gpu_name(where):
        from ..gpu.cuda_devices import ordinal_of

        gpu = given_or_read(system).gpu(where)
        return torch_tier.move(tensor, torch.device("cuda", ordinal_of(gpu.pci_bus_id)))
    return torch_tier.move(tensor, tier_pool(where, system=system))
