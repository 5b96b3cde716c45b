"""Host memory on a tier for the offloads: the allocator ``offload_layers`` and
``offload_model`` share (uint8 CPU tensors, pinned ones registered with the GPU)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...base.errors import InvalidRequestError
from .._import import import_torch

# (bytes, pinned) -> a uint8 CPU tensor on the tier; pinned ones are registered with the GPU
HostAlloc = Callable[[int, bool], Any]


def tier_allocator(
    nodes: Sequence[int], ctx: Any = None, huge: Any = "auto", *, room_checked: bool = False
) -> HostAlloc:
    """Host memory on ``nodes`` for the offloads, as uint8 CPU tensors: pinned ones
    registered with the GPU of ``ctx`` (a GpuContext) and checked to be on the nodes
    still after the pin; others only placed. Each allocation is refused where the nodes
    lack the room, unless the caller checked the whole of it already (``room_checked``:
    a measurement's ``Pair.check_fits``). The allocator keeps the registrations alive as
    long as it lives (the offload keeps it)."""
    from ...numa.placement import NumaBuffer, allocate
    from ...numa.policy import Policy

    torch = import_torch()
    owners: list[Any] = []

    def place(nbytes: int) -> Any:
        if room_checked:
            return NumaBuffer(nbytes, Policy.bind(*nodes), huge=huge)
        return allocate(nbytes, list(nodes), huge=huge)

    def host_alloc(nbytes: int, pinned: bool) -> Any:
        if pinned:
            if ctx is None:
                raise InvalidRequestError("pinned host memory needs a GPU to pin it for")
            from ...gpu.memory import HostMemory

            mem = HostMemory.owning(ctx, place(nbytes))
            owners.append(mem)
            return torch.from_numpy(mem.array("uint8"))
        return torch.from_numpy(place(nbytes).array("uint8"))

    return host_alloc


def pages_of(tensors: Sequence[Any]) -> dict[int, int]:
    """Pages of the host memory of ``tensors`` per NUMA node, counted now."""
    from collections import Counter

    from ...numa.pages import pages_by_node

    total: Counter[int] = Counter()
    for t in tensors:
        total.update(pages_by_node(t))
    return dict(sorted(total.items()))
