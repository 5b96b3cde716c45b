"""Memory hotplug blocks (/sys/devices/system/memory): how dax memory becomes a node's.

A dax device in system-ram mode (kmem) adds its range as memory blocks; each block is
onlined into a zone by writing its ``state``: ``online_movable`` (ZONE_MOVABLE: the
kernel keeps its own allocations out, so the block can be offlined again) or
``online_kernel`` (ZONE_NORMAL).

The zone decides what long-term pins do (GPU registration, RDMA, io_uring fixed
buffers: ``pin_user_pages(FOLL_LONGTERM)``): the kernel never leaves a long-term-pinned
page in ZONE_MOVABLE, it migrates it to a non-movable zone first, which on a CPU-less
CXL node means another node. Memory in ZONE_NORMAL keeps its pinned pages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..base.errors import SysfsError
from ..base.sysfs import Sysfs
from ..base.values import word

MEMORY_BLOCKS = "/sys/devices/system/memory"

Zone = Literal["movable", "normal"]
ONLINE_STATE: dict[Zone, str] = {"movable": "online_movable", "normal": "online_kernel"}


# The zone of a node's (or device's) online memory: all movable, all normal, or both.
ZoneState = Literal["movable", "normal", "mixed"]
# Whether long-term pins stay in memory of that zone (mixed: only in its normal part).
HOLDS_LONGTERM_PINS: dict[str, bool | None] = {"normal": True, "movable": False, "mixed": None}


def zone_of(blocks: list[MemoryBlock]) -> ZoneState | None:
    """The zone of the online blocks; None when none is online."""
    zones = {"movable" if b.movable else "normal" for b in blocks if b.online}
    if not zones:
        return None
    return "mixed" if len(zones) > 1 else ("movable" if "movable" in zones else "normal")


def combine_zones(zones: list[str | None]) -> str | None:
    """One zone for several devices' memory (a node fed by more than one region)."""
    known = {z for z in zones if z is not None}
    if not known:
        return None
    return known.pop() if len(known) == 1 else "mixed"


def check_zone(zone: str) -> Zone:
    """``zone`` if it is 'movable' or 'normal', else InvalidRequestError."""
    return word(zone, "zone", ("movable", "normal"))  # type: ignore[return-value]


@dataclass(frozen=True)
class MemoryBlock:
    index: int
    state: str  # 'online', 'offline', 'going-offline'
    zone: str | None  # 'Movable', 'Normal'... for an online block

    @property
    def path(self) -> str:
        """The block's state attribute (the file that onlines and offlines it)."""
        return state_path(self.index)

    @property
    def online(self) -> bool:
        """Whether the block is online."""
        return self.state == "online"

    @property
    def movable(self) -> bool:
        """Whether the online block is in ZONE_MOVABLE."""
        return self.zone == "Movable"


def state_path(index: int) -> str:
    """The state attribute of memory block ``index``."""
    return f"{MEMORY_BLOCKS}/memory{index}/state"


def block_size(fs: Sysfs) -> int | None:
    """Bytes per memory block, as the kernel reports it (None if unknown)."""
    rel = f"{MEMORY_BLOCKS}/block_size_bytes"
    text = fs.read(rel)
    if not text:
        return None
    try:
        size = int(text, 16)  # hex without a 0x prefix
    except ValueError:
        raise SysfsError(rel, f"expected a size in hex, found {text!r}") from None
    if size <= 0:
        raise SysfsError(rel, f"expected a positive size, found {text!r}")
    return size


def blocks_in_range(fs: Sysfs, start: int, size: int) -> list[MemoryBlock]:
    """The memory blocks that exist for [start, start + size)."""
    bs = block_size(fs)
    if not bs:
        return []
    first, end = start // bs, (start + size + bs - 1) // bs
    # the blocks that exist, not every index the range spans (a size read from a
    # recorded tree can be any number)
    present = sorted(int(n[6:]) for n in fs.listdir(MEMORY_BLOCKS)
                     if n.startswith("memory") and n[6:].isdecimal())  # fmt: skip
    out = []
    for idx in (i for i in present if first <= i < end):
        state = fs.read(state_path(idx))
        if state is None:
            continue
        zone = None
        if state == "online":
            # valid_zones of an online block names the zone it is in
            zone = (fs.read(f"{MEMORY_BLOCKS}/memory{idx}/valid_zones") or "").split()[:1]
        out.append(MemoryBlock(idx, state, zone[0] if zone else None))
    return out


def online_state_of(block: MemoryBlock) -> str:
    """The state to write to put an online block back into its zone."""
    return "online_movable" if block.movable else "online_kernel"
