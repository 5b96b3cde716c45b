"""GPU-addressable memory on a tier (native/tier.c): physical memory the CUDA driver
creates on one host NUMA node, mapped into the GPUs' address space, which every GPU reads
and writes in place (zero-copy) and CUDA copies as device memory; freed mappings are
cached for reuse in stream order. The node of each new mapping's pages is asked of the
kernel (move_pages), and a mapping with a page elsewhere is refused.

Where the driver cannot create memory on a host node (before 12.2), a pool's memory is
registered instead: anonymous memory bound to the node (mbind), pinned and mapped for
the GPUs (cuMemHostRegister), which kernels read and write in place as well; CUDA takes
it for host memory. ``PYCXL_TIER_MEMORY`` chooses: ``auto`` (the default), ``host-numa``
(only memory the driver creates on the node) or ``registered``.

``TierPool`` is one open pool (one per node, at most eight); ``TierMemory`` one
allocation, with ``__cuda_array_interface__`` for CuPy, Numba or PyTorch. The PyTorch
side (a MemPool per tier, spilling on out-of-memory) is pycxl/torch/tier.py.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from ..base._lib import compiled
from ..base.errors import InvalidRequestError, NotAvailableError, OperationError
from ..numa import pages
from . import driver as drv
from .context import GpuContext
from .memory import byte_array_interface

CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_INVALID_VALUE = 1
MEMORY_ENV = "PYCXL_TIER_MEMORY"

_lock = threading.Lock()
_pools: dict[int, TierPool] = {}  # node -> its pool: one per node for the process


@dataclass(frozen=True)
class TierStats:
    """A tier pool's counters. ``gpu_refusals``: allocations the whole-process allocator
    sent to the spill tier (any tier) because the GPU's memory refused them or they would
    have eaten into the headroom left for cuBLAS and cuDNN."""

    tier: str
    node: int
    bytes_now: int
    bytes_peak: int
    allocations: int
    bytes_allocated: int
    refused: int
    misplaced_pages: int
    mapped: int  # what the pool holds from the driver, in use or cached for reuse
    gpu_refusals: int
    last_error: str

    def summary(self) -> str:
        """A few lines, as ``torch.cuda.memory_summary`` gives them, for logs."""
        from ..base.units import format_size

        lines = [
            f"{self.tier} (node {self.node}): {format_size(self.bytes_now)} in use, "
            f"{format_size(self.bytes_peak)} at peak, {format_size(self.mapped)} mapped",
            f"  {self.allocations} allocations ({format_size(self.bytes_allocated)} asked), "
            f"{self.refused} refused, {self.misplaced_pages} misplaced pages, "
            f"{self.gpu_refusals} spilled from the GPU's memory",
        ]
        if self.last_error:
            lines.append(f"  last refusal: {self.last_error}")
        return "\n".join(lines)


class TierPool:
    """The pool of one tier; ``allocate`` gives TierMemory, ``stats`` its counters."""

    def __init__(self, slot: int, node: int, tier: str, registered: bool = False) -> None:
        self.slot, self.node, self.tier = slot, node, tier
        self.registered = registered  # mbind + cuMemHostRegister, not the host-node VMM
        self._context: GpuContext | None = None

    def __repr__(self) -> str:
        how = ", registered" if self.registered else ""
        return f"TierPool({self.tier}, node {self.node}{how})"

    @property
    def allocator_symbols(self) -> tuple[str, str]:
        """The C functions (malloc, free) of this pool, in ``compiled.module_path()``."""
        return f"pycxl_tier_malloc_{self.slot}", f"pycxl_tier_free_{self.slot}"

    def stats(self) -> TierStats:
        """The pool's counters now."""
        counts, error = compiled.tier_stats(self.slot)
        return TierStats(self.tier, self.node, **counts, last_error=error)

    def allocate(self, size: int, stream: int = 0) -> TierMemory:
        """``size`` bytes in ``stream``'s order (0: the current context's default
        stream); OperationError, saying why, when the pool refuses."""
        if size <= 0:
            raise InvalidRequestError(f"an allocation needs a positive size, not {size}")
        if self._context is None:  # outside PyTorch, the driver calls need a context
            self._context = GpuContext(0)
        self._context.activate()
        pointer = compiled.tier_alloc(self.slot, size, stream)
        if pointer == 0:
            raise OperationError(f"{self.tier}: {self.stats().last_error or 'allocation refused'}")
        return TierMemory(self, pointer, size, stream)

    def trim(self) -> None:
        """Give what the pool caches, unused, back to the kernel."""
        compiled.tier_trim(self.slot)


class TierMemory:
    """``size`` bytes on a tier that GPUs read and write in place; freed (in stream
    order) on ``close()``, at the end of a ``with`` block, or when collected."""

    def __init__(self, pool: TierPool, pointer: int, size: int, stream: int) -> None:
        self.pool, self.ptr, self.size = pool, pointer, size
        self._free = weakref.finalize(self, compiled.tier_free, pointer, stream)

    def __repr__(self) -> str:
        return f"TierMemory({self.pool.tier}, ptr={self.ptr:#x}, size={self.size})"

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if not self._free.alive:
            raise InvalidRequestError("this tier memory was freed")
        return byte_array_interface(self.ptr, self.size)

    def pages_by_node(self) -> dict[int, int]:
        """Pages per node, asked of the kernel."""
        return pages.span_by_node(self.ptr, self.size)

    def close(self) -> None:
        """Free it, after the work queued on its stream (twice is once)."""
        self._free()

    def __enter__(self) -> TierMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def memory_mode() -> int:
    """How pools make their memory, from PYCXL_TIER_MEMORY (checked where it enters)."""
    word = os.environ.get(MEMORY_ENV, "").strip() or "auto"
    if word not in compiled.TIER_MODES:
        raise InvalidRequestError(
            f"{MEMORY_ENV}={word!r}: give one of {', '.join(compiled.TIER_MODES)} (or leave "
            "it unset: auto)"
        )
    return compiled.TIER_MODES[word]


def open_pool(node: int, tier: str) -> TierPool:
    """The pool on ``node`` (a node with memory, checked by the caller), opened once for
    the process, usable by every CUDA device."""
    mode = memory_mode()
    with _lock:
        if node in _pools:
            return _pools[node]
        if len(_pools) >= compiled.TIER_SLOTS:
            raise InvalidRequestError(
                f"at most {compiled.TIER_SLOTS} tiers have pools in one process; "
                f"open: {', '.join(p.tier for p in _pools.values())}"
            )
        ffi, lib = drv.driver()
        count = ffi.new("int *")
        drv.check("cuDeviceGetCount", lib.cuDeviceGetCount(count))
        slot = len(_pools)
        rc, message = compiled.tier_open(slot, node, range(count[0]), mode)
        if rc == -1:
            raise NotAvailableError(message)
        if rc in (CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_INVALID_VALUE):
            raise NotAvailableError(
                f"{tier}: this CUDA driver cannot create memory on a host NUMA node "
                f"({drv.error(message, rc)}); that needs driver 12.2 or later on Linux; "
                f"{MEMORY_ENV}=registered (or unset) uses registered memory instead"
            )
        if rc:
            raise drv.error(message, rc)
        pool = _pools[node] = TierPool(slot, node, tier, compiled.tier_registered(slot))
        return pool
