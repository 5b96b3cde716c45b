"""PyTorch CUDA tensors on a tier, and CUDA out-of-memory that spills onto one.

Two mechanisms over the tier pools of tier_pool.py:

- ``on_tier`` (``pycxl.on_tier``): a ``torch.cuda.MemPool`` whose allocator is one
  tier's; inside ``with``, the CUDA tensors this thread allocates live on the tier
  (PyTorch's caching allocator keeps its blocks in that pool). Works beside PyTorch's
  own allocator, at any time.
- ``spill_to``: the process's CUDA allocator becomes tier.c's, which takes the GPU's own
  memory first (its stream-ordered pool, as PyTorch's ``backend:cudaMallocAsync``) and,
  where that is out of memory or a large allocation would leave less than HEADROOM free,
  the tier's. It must come before the first CUDA allocation (PyTorch allows one allocator
  per process). ``on_tier`` then steers this thread's allocations through it. PyTorch's
  memory statistics are answered from tier.c's counts (spill_stats.py), and an
  optimizer's state is made on the tier where the step would not fit with it in HBM
  (spill_placement.py). cuBLAS's handle for autograd's backward thread is made at the
  first module call with gradients, while HBM has room (spill_handles.py). Forward
  passes without gradients read spilled weights through HBM by copy (spill_weights.py;
  PYCXL_SPILL_STREAM_WEIGHTS=0 reads them in place).

Spills are counted (``TierPool.stats``), and with ``log=True`` (or PYCXL_SPILL_LOG=1) each
one made on the thread that asked is logged with its size, tier and Python call site.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from ..base._lib import compiled
from ..base._log import get_logger
from ..base.errors import InvalidRequestError, NotAvailableError
from ..gpu.tier_pool import TierPool
from . import spill_handles, spill_placement, spill_report, spill_stats, spill_weights
from ._import import import_torch

log = get_logger("pycxl.spill")
SPILL_LOG_ENV = "PYCXL_SPILL_LOG"
STREAM_WEIGHTS_ENV = "PYCXL_SPILL_STREAM_WEIGHTS"  # 0: spilled weights read in place

_spilling: TierPool | None = None  # the tier spill_to installed, once per process
_pools: dict[int, Any] = {}  # slot -> its torch MemPool
_placement: spill_placement.Placement | None = None  # the optimizer step hooks
_handles: spill_handles.BackwardHandles | None = None  # the first module call's hook
_streamer: spill_weights.WeightStreamer | None = None  # inference's spilled weights


def _mem_pool(pool: TierPool) -> Any:
    torch = import_torch("tier tensors")
    mem_pool_type = getattr(torch.cuda, "MemPool", None)
    if mem_pool_type is None or not hasattr(torch.cuda, "use_mem_pool"):
        raise NotAvailableError(
            f"tensors on a tier need torch.cuda.MemPool and use_mem_pool (PyTorch 2.8 or "
            f"later); this is PyTorch {torch.__version__}"
        )
    if pool.slot not in _pools:
        from torch.cuda.memory import CUDAPluggableAllocator

        malloc, free = pool.allocator_symbols
        allocator = CUDAPluggableAllocator(compiled.module_path(), malloc, free)
        _pools[pool.slot] = mem_pool_type(allocator.allocator())  # type: ignore[no-untyped-call]
    return _pools[pool.slot]


@contextlib.contextmanager
def on_tier(pool: TierPool) -> Iterator[TierPool]:
    """CUDA tensors this thread allocates inside the block are on ``pool``'s tier."""
    torch = import_torch("tier tensors")
    if _spilling is not None:  # the process's allocator is tier.c's: steer it
        before = compiled.tier_prefer(pool.slot)
        try:
            yield pool
        finally:
            compiled.tier_prefer(before)
        return
    with torch.cuda.use_mem_pool(_mem_pool(pool)):
        yield pool


def require_cuda_tensor(tensor: Any) -> Any:
    """torch, once ``tensor`` is a CUDA tensor; InvalidRequestError otherwise."""
    torch = import_torch("tier tensors")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
        raise InvalidRequestError("move takes a CUDA tensor; a CPU tensor goes with .to('cuda')")
    return torch


def move(tensor: Any, where: TierPool | Any) -> Any:
    """A copy of CUDA ``tensor`` on a tier (a TierPool) or in a GPU's own memory (a
    ``torch.device``); the original is left to the caller (``del`` frees it)."""
    torch = require_cuda_tensor(tensor)
    if isinstance(where, TierPool):
        with on_tier(where):
            out = torch.empty_like(tensor)
    else:
        with _in_gpu_memory():
            out = torch.empty_like(tensor, device=where)
    out.copy_(tensor)
    return out


@contextlib.contextmanager
def _in_gpu_memory() -> Iterator[None]:
    if _spilling is None:
        yield
        return
    before = compiled.tier_prefer(-1)
    try:
        yield
    finally:
        compiled.tier_prefer(before)


HEADROOM = 512 << 20  # GPU memory left for cuBLAS and cuDNN, which allocate on their own


def spill_to(
    pool: TierPool, *, log_spills: bool | None = None, headroom: int = HEADROOM
) -> TierPool:
    """CUDA allocations that the GPU's memory refuses land on ``pool``'s tier, for the
    rest of the process; so do large ones that would leave less than ``headroom`` bytes
    of it free (cuBLAS and cuDNN make their handles and workspaces on first use, on each
    thread, outside PyTorch's allocator). Call it before the first CUDA allocation."""
    global _spilling, _placement, _handles, _streamer
    torch = import_torch("spilling onto a tier")
    if _spilling is not None:
        if _spilling is pool:
            return pool
        raise InvalidRequestError(
            f"this process spills to {_spilling.tier} already; one spill tier per process"
        )
    from torch.cuda.memory import CUDAPluggableAllocator, change_current_allocator

    if torch.cuda.is_initialized() and torch.cuda.memory_allocated() > 0:
        raise InvalidRequestError(
            "CUDA memory is allocated already: call spill_to before the program's first "
            "CUDA allocation (PyTorch takes one allocator per process), or run the "
            "unchanged program with pycxl spill TIER SCRIPT"
        )
    placement = spill_placement.install(torch, pool.slot, headroom)  # refuses an old torch
    try:
        allocator = CUDAPluggableAllocator(compiled.module_path(), "pycxl_cuda_malloc",
                                           "pycxl_cuda_free")  # fmt: skip
        change_current_allocator(allocator)
    except RuntimeError as e:
        placement.remove()
        raise InvalidRequestError(
            f"PyTorch refused a new allocator ({e}): call spill_to before the first CUDA allocation"
        ) from None
    compiled.tier_spill_to(pool.slot, headroom)
    _spilling, _placement = pool, placement
    _handles = spill_handles.install(torch)  # the backward thread's cuBLAS handle, in time
    spill_stats.install(torch, pool.slot)
    if streams_weights():
        _streamer = spill_weights.install(torch, _weight_seams(torch, pool, headroom))
    if log_spills is None:
        log_spills = _switched_on(SPILL_LOG_ENV)
    if log_spills:
        compiled.tier_log(_log_spill)
    return pool


def streams_weights() -> bool:
    """Whether a spilling process reads its spilled weights through HBM by copy: yes,
    unless PYCXL_SPILL_STREAM_WEIGHTS is 0."""
    return _switched_on(STREAM_WEIGHTS_ENV, default=True)


def _switched_on(variable: str, *, default: bool = False) -> bool:
    """``variable`` set to anything but 0; unset, empty or blank: ``default``."""
    value = os.environ.get(variable, "").strip()
    return default if value == "" else value != "0"


def _weight_seams(torch: Any, pool: TierPool, headroom: int) -> spill_weights.Seams:
    """The streamer's view of this process: the tier's allocations and HBM's room."""

    def on_tier(t: Any) -> bool:
        return compiled.tier_owns(t.untyped_storage().data_ptr())

    def hbm_room(device: Any) -> int:
        torch.cuda.synchronize(device)
        return max((compiled.tier_hbm_room(device.index or 0, settle=True) or 0) - headroom, 0)

    def hbm_only(make: Callable[[], Any]) -> Any:
        """``make``'s tensor where it landed in HBM; None where it would have spilled."""
        with _in_gpu_memory():
            t = make()
        return None if on_tier(t) else t

    def in_hbm(device: Any, n: int) -> Any:
        return hbm_only(lambda: torch.empty(n, dtype=torch.uint8, device=device))

    def to_hbm(t: Any) -> Any:
        out = hbm_only(lambda: torch.empty_like(t))
        return None if out is None else out.copy_(t)

    return spill_weights.Seams(
        on_tier=on_tier,
        to_tier=lambda t: move(t, pool),
        hbm_room=hbm_room,
        in_hbm=in_hbm,
        to_hbm=to_hbm,
        trained=lambda: _placement is not None and _placement.steps > 0,
    )


def spilling() -> TierPool | None:
    """The tier this process spills to, if any."""
    return _spilling


def spill_reports() -> list[spill_report.SpillReport]:
    """What the spill did, one report per CUDA device the process used (none where it
    does not spill)."""
    if _spilling is None:
        return []
    torch = import_torch()
    out = []
    for device in range(torch.cuda.device_count() if torch.cuda.is_initialized() else 0):
        r = spill_report.report(_spilling, device, _placement.steps if _placement else 0)
        if r.hbm_peak or r.tier_peak:
            out.append(r)
    return out


def _log_spill(slot: int, size: int) -> None:
    tier = _spilling.tier if _spilling is not None else f"slot {slot}"
    site = _call_site()
    log.warning("spilled %d bytes to %s at %s", size, tier, site)


def _call_site() -> str:
    """The innermost frame outside PyTorch's and pycxl's own packages."""
    torch = import_torch()
    skip = tuple(os.path.dirname(os.path.abspath(m.__file__ or "")) + os.sep
                 for m in (torch, sys.modules["pycxl"]))  # fmt: skip
    for frame in reversed(traceback.extract_stack()[:-2]):
        if os.path.abspath(frame.filename).startswith(skip):
            continue
        return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "(no Python frame)"
