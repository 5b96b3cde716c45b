"""PyTorch's memory statistics for a process that spills.

PyTorch keeps no statistics for a pluggable allocator (``torch.cuda.memory_stats`` and
everything built on it raise "does not yet support getDeviceStats"), so a script that
reports its memory would die under the spill. tier.c counts what the process holds, by
device, as PyTorch's allocator does; ``install`` answers PyTorch's three statistics
entry points from those counts, so ``memory_allocated``, ``max_memory_allocated``,
``memory_reserved``, ``reset_peak_memory_stats``, ``memory_stats`` and
``memory_summary`` work as they do without the spill.

What the figures mean under the spill:
- allocated, active and requested bytes: what the program holds, in HBM and on the tier
  together (each allocation is its own block: none is rounded or split);
- reserved bytes: what the device's stream-ordered pool reserves (the driver's count) and
  what the tier maps, cached mappings included; the peak adds the two high marks, an
  upper bound where they did not coincide;
- ``hbm_bytes``, ``tier_bytes``, ``tier_optimizer_state_bytes`` and
  ``tier_saved_activation_bytes`` (``memory_stats()``'s ``hbm_bytes.all.current`` and so
  on): the bytes in HBM and on the tier apart, and what the tier holds on purpose;
- ``num_ooms``: allocations the tier refused too (PyTorch raised out-of-memory).
"""

from __future__ import annotations

from typing import Any

from ..base._lib import compiled

Figure = tuple[int, int, int, int]  # current, peak, allocated, freed
STAT_KEYS = ("current", "peak", "allocated", "freed")
ZERO: Figure = (0, 0, 0, 0)


def _stat(figure: Figure) -> dict[str, int]:
    return dict(zip(STAT_KEYS, figure, strict=True))


def _pools(all_: Figure, small: Figure, large: Figure) -> dict[str, dict[str, int]]:
    return {"all": _stat(all_), "small_pool": _stat(small), "large_pool": _stat(large)}


def nested_stats(figures: dict[str, Figure], reserved: Figure, ooms: int) -> dict[str, Any]:
    """``torch.cuda.memory_stats_as_nested_dict``'s answer from tier.c's ``figures``
    (compiled.USE_FIGURES) and the ``reserved`` bytes (current, peak, allocated, freed)."""
    f = figures
    nbytes = _pools(f["bytes"], f["bytes_small"], f["bytes_large"])
    counts = _pools(f["count"], f["count_small"], f["count_large"])
    # the driver's pool and the tier reserve in granules of 2 MiB and more: PyTorch's
    # large segments
    reserved_pools = _pools(reserved, ZERO, reserved)
    return {
        "allocated_bytes": nbytes,
        "active_bytes": nbytes,
        "requested_bytes": nbytes,
        "allocation": counts,
        "active": counts,
        # each allocation is its own driver allocation
        "segment": counts,
        "reserved_bytes": reserved_pools,
        "inactive_split": _pools(ZERO, ZERO, ZERO),  # nothing is split
        "inactive_split_bytes": _pools(ZERO, ZERO, ZERO),
        "oversize_allocations": _stat(ZERO),
        "oversize_segments": _stat(ZERO),
        "hbm_bytes": {"all": _stat(f["hbm_bytes"])},
        "tier_bytes": {"all": _stat(f["tier_bytes"])},
        "tier_optimizer_state_bytes": {"all": _stat(f["tier_state_bytes"])},
        "tier_saved_activation_bytes": {"all": _stat(f["tier_saved_bytes"])},
        "tier_spilled_bytes": {"all": _stat(f["tier_other_bytes"])},
        "num_alloc_retries": 0,
        "num_ooms": ooms,
        "num_sync_all_streams": 0,
        "num_device_alloc": f["count"][2],
        "num_device_free": f["count"][3],
        "max_split_size": -1,
    }


def device_stats(device: int, spill_slot: int) -> dict[str, Any]:
    """The nested statistics of CUDA ``device`` in this spilling process."""
    figures, _ = compiled.tier_use(device)
    hbm = compiled.tier_hbm_reserved(device) or (0, 0)
    tier = compiled.tier_spill_mapped() or (0, 0)
    moved = figures["bytes"]
    reserved = (hbm[0] + tier[0], hbm[1] + tier[1], moved[2], moved[3])
    ooms = compiled.tier_stats(spill_slot)[0]["refused"]
    return nested_stats(figures, reserved, ooms)


def install(torch: Any, spill_slot: int) -> None:
    """Answer PyTorch's memory statistics from tier.c's counts from now on."""
    c = torch._C

    def memory_stats(device: int) -> dict[str, Any]:
        return device_stats(int(device), spill_slot)

    def reset_peak(device: int) -> None:
        compiled.tier_use_reset(int(device), totals=False)

    def reset_totals(device: int) -> None:
        compiled.tier_use_reset(int(device), totals=True)

    c._cuda_memoryStats = memory_stats
    c._cuda_resetPeakMemoryStats = reset_peak
    c._cuda_resetAccumulatedMemoryStats = reset_totals
