"""The kernel's region protocol (Documentation/ABI/testing/sysfs-bus-cxl) as plans.

Create: claim a name from the root decoder (``create_ram_region``; a racing creator
makes the write fail with EBUSY), set granularity, ways and size, give each endpoint
decoder its mode and DPA share and attach it at its position, commit the decode, bind
the region driver, wait for the dax device, online its memory blocks.
Teardown reverses it: offline the memory, unbind, reset decode, detach targets, free
DPA, delete.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterable

from ..base.errors import OperationError, SysfsError
from ..base.plan import Plan, Step, Undo, action, write
from ..base.sysfs import Sysfs
from ..base.values import PARTITION_MODES, VOLATILE_MODES
from ..base.waiting import wait_until
from . import dax, memory_blocks
from .dax import read_dax_devices
from .memory_blocks import ONLINE_STATE, Zone
from .model import DaxDevice, Region
from .read import CXL_DEVICES
from .region_layout import RegionLayout

REGION_DRIVER = "/sys/bus/cxl/drivers/cxl_region"
# Offlining a block whose pages cannot move (long-term pinned) retries in the kernel
# until a fatal signal: give up after this long (the block stays online).
OFFLINE_TIMEOUT_S = 30.0
DAX_WAIT_S = 60.0  # the dax device appears after the region driver probes (slow under TCG)


def _dev(name: str) -> str:
    return f"{CXL_DEVICES}/{name}"


def next_region_name(fs: Sysfs, layout: RegionLayout) -> str:
    """The name the root decoder offers for the next region of this type."""
    attr = f"{_dev(layout.root.name)}/create_{layout.type}_region"
    name = fs.read(attr)
    if not name:
        raise OperationError(
            f"{attr} is missing or empty: this kernel cannot create {layout.type} regions "
            "from user space (CONFIG_CXL_REGION, Linux 6.3+ for ram)"
        )
    return name


def create_plan(
    fs: Sysfs, layout: RegionLayout, name: str, *, online: bool, zone: Zone,
    mode: str = "system-ram",
) -> Plan:  # fmt: skip
    """The sysfs steps that create, commit, bind and (optionally) online a region, or
    (``mode="devdax"``) hand its dax device to device_dax."""
    root = _dev(layout.root.name)
    reg = _dev(name)
    steps = [
        write(
            f"claim {name} from root decoder {layout.root.name}",
            f"{root}/create_{layout.type}_region",
            name,
            (f"{root}/delete_region", name),
        )
    ]
    if layout.uuid:
        # the kernel takes exactly a UUID and its newline (uuid_store: EINVAL otherwise)
        steps.append(write("set the pmem region's uuid", f"{reg}/uuid", f"{layout.uuid}\n"))
    steps += [
        write("set interleave granularity", f"{reg}/interleave_granularity",
              str(layout.granularity)),
        write("set interleave ways", f"{reg}/interleave_ways", str(layout.ways)),
        write("allocate host address space", f"{reg}/size", str(layout.size),
              (f"{reg}/size", "0")),
    ]  # fmt: skip
    for t in layout.targets:
        ep = _dev(t.decoder.name)
        undo_mode = (
            ((f"{ep}/mode", t.decoder.mode),)
            if t.decoder.mode in PARTITION_MODES and t.decoder.mode != layout.type
            else ()
        )
        steps += [
            write(f"{t.decoder.name} ({t.memdev.name}) decodes {layout.type}",
                  f"{ep}/mode", layout.type, *undo_mode),
            write(f"allocate {layout.dpa_size >> 20} MiB of {t.memdev.name}'s DPA",
                  f"{ep}/dpa_size", str(layout.dpa_size), (f"{ep}/dpa_size", "0")),
            write(f"{t.memdev.name} at position {t.position}", f"{reg}/target{t.position}",
                  t.decoder.name, (f"{reg}/target{t.position}", "\n")),
        ]  # fmt: skip
    steps += [
        write("commit the decoders", f"{reg}/commit", "1", (f"{reg}/commit", "0")),
        bind_step(name),
    ]
    if layout.type in VOLATILE_MODES and mode == "devdax":
        steps += devdax_steps(name)
    elif layout.type in VOLATILE_MODES and online:
        steps += online_steps(fs, name, zone)
    return Plan(f"create {name}", tuple(steps), action="create")


def devdax_steps(name: str) -> list[Step]:
    """Steps that wait for the region's dax device and leave it in devdax mode."""
    return [
        action(f"wait for {name}'s dax device", lambda f: _wait_dax(f, name, "any")),
        action(f"switch {name}'s dax devices to devdax (offline, kmem -> device_dax)",
               lambda f: _switch_mode(f, name, "devdax")),
    ]  # fmt: skip


def system_ram_steps(name: str, zone: Zone) -> list[Step]:
    """Steps that hand a devdax region's dax devices to kmem and online them in ``zone``."""
    state = ONLINE_STATE[zone]
    return [
        action(f"switch {name}'s dax devices to system-ram (device_dax -> kmem)",
               lambda f: _switch_mode(f, name, "system-ram")),
        action(f"online {name}'s memory blocks ({state})",
               lambda f: _online_blocks(f, name, state)),
    ]  # fmt: skip


def bind_step(name: str) -> Step:
    """The step that binds the region driver to a committed region."""
    return write(
        "bind the region driver",
        f"{REGION_DRIVER}/bind",
        name,
        (f"{REGION_DRIVER}/unbind", name),
    )


def online_steps(fs: Sysfs, name: str, zone: Zone) -> list[Step]:
    """Steps that wait for the region's dax device and online its memory in ``zone``."""
    state = ONLINE_STATE[zone]
    return [
        action(
            f"wait for {name}'s dax device in system-ram mode",
            lambda f: _wait_dax(f, name, "system-ram"),
        ),
        action(
            f"online {name}'s memory blocks ({state})",
            lambda f: _online_blocks(f, name, state),
        ),
    ]


def rezone_steps(region: Region, zone: Zone) -> list[Step]:
    """Move a region's online memory into ``zone``: offline every block (refused, and put
    back, if the kernel cannot move a page off, as pinned pages), then online them all
    in the new zone. Undone newest first: offlined again, then back in the old zone."""
    warnings: list[str] = []
    steps = [
        action(f"offline {d.name}'s memory blocks (node {d.target_node}, now {d.zone})",
               _offliner(d, False, warnings, can_force=False))
        for d in region.dax_devices
        if d.online_memblocks
    ]  # fmt: skip
    state = ONLINE_STATE[zone]
    name = region.name
    steps.append(action(f"online {name}'s memory blocks ({state})",
                        lambda f: _online_blocks(f, name, state)))  # fmt: skip
    return steps


def teardown_plan(region: Region, *, delete: bool, force: bool, warnings: list[str]) -> Plan:
    """Disable (offline + unbind) and, with ``delete``, destroy a region."""
    reg = _dev(region.name)
    steps: list[Step] = []
    for d in region.dax_devices:
        if d.online_memblocks:
            steps.append(
                action(
                    f"offline {d.name}'s memory blocks (node {d.target_node})",
                    # destroy resets the decoders: memory left online would then be
                    # routed nowhere (a crash), so only disable may leave some online
                    _offliner(d, force and not delete, warnings, can_force=not delete),
                )
            )
    if region.enabled:
        steps.append(
            write("unbind the region driver", f"{REGION_DRIVER}/unbind", region.name,
                  (f"{REGION_DRIVER}/bind", region.name))
        )  # fmt: skip
    if not delete:
        return Plan(f"disable {region.name}", tuple(steps), action="disable")
    if region.committed:
        steps.append(write("reset the decoders", f"{reg}/commit", "0", (f"{reg}/commit", "1")))
    topo = region._topo()
    for m in sorted(region.mappings, key=lambda m: m.position, reverse=True):
        ep = _dev(m.decoder)
        dpa = topo.decoder(m.decoder).dpa_size or 0
        steps += [
            write(f"detach {m.decoder} from position {m.position}", f"{reg}/target{m.position}",
                  "\n", (f"{reg}/target{m.position}", m.decoder)),
            write(f"free {m.memdev or m.decoder}'s DPA", f"{ep}/dpa_size", "0",
                  (f"{ep}/dpa_size", str(dpa))),
        ]  # fmt: skip
    root = _dev(region.decoder)
    steps.append(write(f"delete {region.name}", f"{root}/delete_region", region.name))
    return Plan(f"destroy {region.name}", tuple(steps), action="destroy")


# --- actions -------------------------------------------------------------------------
def region_dax(fs: Sysfs, name: str) -> list[DaxDevice]:
    """The region's dax devices, as the kernel lists them now."""
    return [d for d in read_dax_devices(fs) if d.region == name]


def _wait_dax(fs: Sysfs, name: str, want: str) -> None:
    def ready() -> list[DaxDevice] | None:
        devs = region_dax(fs, name)
        return devs if devs and all(d.mode != "unbound" for d in devs) else None

    devs = wait_until(
        ready,
        what=f"the dax device of {name}",
        timeout=DAX_WAIT_S,
        subsystem="dax",
        live=fs.root == os.sep,
    )
    for d in devs:
        if want == "system-ram" and d.mode == "devdax" and fs.is_dir(f"{dax.DAX_DRIVERS}/kmem"):
            # a stale id in device_dax's table (an earlier devdax switch by another
            # tool) took the new device: give it to kmem, as the region asks
            dax.unbind(fs, d.name, "devdax")
            with contextlib.suppress(OperationError):
                fs.write(f"{dax.DAX_DRIVERS}/device_dax/remove_id", d.name)
            dax.bind(fs, d.name, "system-ram")
            continue
        if want == "system-ram" and d.mode != "system-ram":
            raise OperationError(
                f"{d.name} came up in {d.mode} mode, not system-ram; switch it with "
                f"'daxctl reconfigure-device --mode=system-ram {d.name}', or load kmem "
                "(modprobe kmem) before creating the region"
            )


def _switch_mode(fs: Sysfs, name: str, mode: str) -> Undo:
    """Give each of the region's dax devices to the driver of ``mode`` (offlining its
    memory first when it leaves system-ram); what is done is undone on failure."""
    undo: list[Undo] = []

    def revert(f: Sysfs) -> None:
        for u in reversed(undo):
            u(f)

    try:
        for d in region_dax(fs, name):
            if d.mode == mode:
                continue
            if d.mode == "system-ram" and d.online_memblocks:
                undo.append(_offliner(d, False, [], can_force=False)(fs))
            if d.mode in dax.DRIVER_OF_MODE:
                dax.unbind(fs, d.name, d.mode)
                undo.append(_rebinder(d.name, d.mode))
            dax.bind(fs, d.name, mode)
            undo.append(_unbinder(d.name, mode))
    except Exception:
        revert(fs)
        raise
    return revert


def _rebinder(name: str, mode: str) -> Undo:
    return lambda f: dax.bind(f, name, mode)


def _unbinder(name: str, mode: str) -> Undo:
    return lambda f: dax.unbind(f, name, mode)


def _online_blocks(fs: Sysfs, name: str, state: str) -> Undo:
    done: list[int] = []
    try:
        for dax in region_dax(fs, name):
            assert dax.resource is not None
            for block in memory_blocks.blocks_in_range(fs, dax.resource, dax.size):
                if not block.online:
                    fs.write(block.path, state)
                    done.append(block.index)
    except Exception:
        _set_blocks(fs, reversed(done), "offline")
        raise
    return lambda f: _set_blocks(f, reversed(done), "offline")


def _offliner(
    dax: DaxDevice, force: bool, warnings: list[str], *, can_force: bool
) -> Callable[[Sysfs], Undo]:
    def offline(fs: Sysfs) -> Undo:
        assert dax.resource is not None
        blocks = [b for b in memory_blocks.blocks_in_range(fs, dax.resource, dax.size) if b.online]
        done: list[memory_blocks.MemoryBlock] = []
        for b in reversed(blocks):
            try:
                fs.write(b.path, "offline", timeout=OFFLINE_TIMEOUT_S)
                done.append(b)
            except SysfsError as e:
                why = _offline_refusal(dax, b, e, can_force)
                if not force:
                    for d in reversed(done):
                        fs.write(d.path, memory_blocks.online_state_of(d))
                    raise OperationError(why) from e
                warnings.append(why + "; --force: going on, that range stays online and is "
                                "lost to the system until reboot")  # fmt: skip

        def reonline(f: Sysfs) -> None:
            for d in reversed(done):
                f.write(d.path, memory_blocks.online_state_of(d))

        return reonline

    return offline


def _offline_refusal(
    dax: DaxDevice, block: memory_blocks.MemoryBlock, e: SysfsError, can_force: bool
) -> str:
    if e.errno == errno.EBUSY:
        reason = "it holds pages the kernel cannot move (pinned, or kernel memory in ZONE_NORMAL)"
    elif e.errno == errno.ETIMEDOUT:
        reason = (
            f"the kernel could not move its pages off within {OFFLINE_TIMEOUT_S:.0f} s "
            "(long-term pinned pages, such as GPU-registered memory, never move)"
        )
    else:
        reason = str(e)
    retry = f"stop what uses node {dax.target_node} and retry"
    if can_force:
        retry += ", or pass --force (the range then stays online until reboot)"
    else:
        retry += (
            " (a region is destroyed only when all its memory is offline: its decoders must "
            "route memory that is online; 'pycxl region disable --force' leaves it in use)"
        )
    return (
        f"memory{block.index} of {dax.name} (node {dax.target_node}) cannot be offlined: "
        f"{reason}; {retry}"
    )


def _set_blocks(fs: Sysfs, indexes: Iterable[int], state: str) -> None:
    for idx in indexes:
        fs.write(memory_blocks.state_path(idx), state)
