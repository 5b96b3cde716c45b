"""The library by name: memory on tiers, regions with their tier, host memory for GPUs.

These take what users type (``"cxl0"``, ``"dram0,cxl0"``, ``"gpu0"``, sizes such as
``"256M"``), resolve it against one snapshot (``system``, read when not given) and call
the floors below, which take ids. ``import pycxl`` exposes each of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .cxl import regions as _regions
from .errors import InvalidRequestError
from .system import System, snapshot
from .units import parse_size

if TYPE_CHECKING:
    from .cxl.region_layout import RegionRequest
    from .cxl.regions import RegionResult
    from .gpu.memory import HostMemory
    from .numa.placement import HugePages, NumaBuffer
    from .numa.policy import Policy

Names = str | int | Iterable[str | int]


def _bytes(size: int | str) -> int:
    n = parse_size(size)
    if n <= 0:
        raise InvalidRequestError(f"size must be positive, not {size!r}")
    return n


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
    from .numa import placement

    if (target is None) == (policy is None):
        raise InvalidRequestError("give a target or a policy (one of them)")
    nodes = (system or snapshot(gpus=False)).memory_nodes(target) if target is not None else None
    return placement.allocate(_bytes(size), nodes, policy=policy, huge=huge, populate=populate)


def migrate(obj: Any, target: str | int, *, system: System | None = None) -> dict[int, int]:
    """Move the pages of a NumaBuffer, numpy array or other buffer to ``target``'s node
    (a NumaBuffer's later faults follow too); pages per node afterwards."""
    from .numa import placement

    nodes = (system or snapshot(gpus=False)).memory_nodes(target)
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
    system: System | None = None,
) -> HostMemory:
    """``size`` bytes on ``target``, touched there, pinned and mapped for ``gpu``
    (zero-copy and DMA); ``close()`` unregisters and frees them."""
    from .gpu.memory import GpuContext, HostMemory

    s = system or snapshot()
    nodes = s.memory_nodes(target)
    return HostMemory.allocate(GpuContext(s.gpu(gpu).ordinal), _bytes(size), nodes, huge=huge)


def _with_tier(result: RegionResult, sysroot: str | None) -> RegionResult:
    if result.numa_node is None:
        return result
    tier = snapshot(sysroot, gpus=False).tier_name(result.numa_node)
    return dataclasses.replace(result, tier=tier)


def create_region(
    request: RegionRequest, *, sysroot: str | None = None, dry_run: bool = False
) -> RegionResult:
    """Create, commit, bind and (by default) online a region; the result names its NUMA
    node and tier (``cxl0``...). See ``RegionRequest`` for what can be asked."""
    result = _regions.create_region(request, sysroot=sysroot, dry_run=dry_run)
    return result if dry_run else _with_tier(result, sysroot)


def enable_region(
    name: str,
    *,
    online: bool = True,
    zone: str = "movable",
    sysroot: str | None = None,
    dry_run: bool = False,
) -> RegionResult:
    """Bind a committed region and online its memory; the result names its tier."""
    from .cxl.memory_blocks import check_zone

    result = _regions.enable_region(
        name, online=online, zone=check_zone(zone), sysroot=sysroot, dry_run=dry_run
    )
    return result if dry_run else _with_tier(result, sysroot)


destroy_region = _regions.destroy_region
disable_region = _regions.disable_region
