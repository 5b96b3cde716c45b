"""Device physical address (DPA) space reserved on a memdev's endpoint decoder and
freed again (ndctl's ``reserve-dpa`` and ``free-dpa``): the step a region's creation
takes for each device, done on its own.

The kernel hands out DPA in order (each decoder's span follows the one before) in
256 MiB units, and frees it newest first; the checks here say so before a write.
"""

from __future__ import annotations

from ..base.errors import InvalidRequestError, NotFoundError, OperationError
from ..base.plan import Plan, Step, write
from ..base.sysfs import Sysfs
from ..base.values import PARTITION_MODES, RAM, PartitionMode, count, is_digits, word
from . import device_ops
from .device_ops import CXL_DEVICES, DeviceResult
from .model import Decoder, Memdev

DPA_UNIT = 256 << 20  # the kernel's dpa_size granule (SZ_256M)


def _available(m: Memdev, mode: PartitionMode) -> int:
    used = sum(d.dpa_size or 0 for d in m.decoders if d.mode == mode)
    free = m.partition_size(mode) - used
    if free < 0:
        raise OperationError(f"{m.name}: its decoders hold more {mode} DPA than it has")
    return free


def _pick(m: Memdev, ident: str | None, auto: Decoder | None, force: bool,
          none: str) -> Decoder:  # fmt: skip
    """The decoder asked for (decoder2.1, or 1 on the memdev's port), else the next in
    sequence; one out of sequence only with ``force``, as ndctl. ``none``: why there is
    no next one, where there is none."""
    if ident is None:
        if auto is None:
            raise InvalidRequestError(f"{m.name}: {none}")
        return auto
    ep = m.endpoint
    assert ep is not None
    name = f"decoder{ep.name.removeprefix('endpoint')}.{ident}" if is_digits(ident) else ident
    target = next((d for d in m.decoders if d.name == name), None)
    if target is None:
        raise NotFoundError("decoder", ident, [d.name for d in m.decoders],
                            problem=f"not one of {m.name}'s endpoint decoders")  # fmt: skip
    if target is not auto and not force:
        expected = auto.name if auto is not None else "none"
        raise InvalidRequestError(
            f"{target.name} is out of sequence: the kernel allocates DPA in decoder order "
            f"and frees it newest first, so the next one is {expected}; pass --force to "
            "try anyway"
        )
    return target


def _newest_reservation(m: Memdev, part: str | None) -> tuple[Decoder | None, str]:
    """The reservation free-dpa frees (the newest, of ``part`` where given, that no
    region decodes), or None and why there is none."""
    newest = next((d for d in reversed(m.decoders) if d.dpa_size), None)
    if newest is None:
        return None, "no DPA is reserved on it: there is nothing to free"
    if newest.size or newest.region:
        region = newest.region or "a region"
        return None, f"its newest reservation ({newest.name}) is decoded by {region}: destroy " \
                     "that region first"  # fmt: skip
    if part is not None and newest.mode != part:
        return None, f"its newest reservation ({newest.name}) is {newest.mode}, not {part}: " \
                     "DPA is freed newest first"  # fmt: skip
    return newest, ""


def _memdev_with_endpoint(fs: Sysfs, memdev: str) -> Memdev:
    m = device_ops.topology(fs).find_memdev(memdev)
    if m.endpoint is None:
        raise InvalidRequestError(f"{m.name} is disabled (no endpoint port): enable it first "
                                  f"(pycxl memdev enable {m.name})")  # fmt: skip
    return m


def reserve_dpa(
    memdev: str,
    *,
    size: int | None = None,
    mode: str = RAM,
    decoder: str | None = None,
    force: bool = False,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Reserve ``size`` bytes (default: all that is free) of ``memdev``'s ``mode``
    capacity on its next free endpoint decoder."""
    memdev, force = device_ops.name(memdev, "memdev"), device_ops.flag(force, "force")
    dry_run = device_ops.flag(dry_run, "dry_run")
    size = None if size is None else count(size, "size")
    decoder = None if decoder is None else device_ops.name(decoder, "decoder")
    part: PartitionMode = word(mode, "type", PARTITION_MODES)  # type: ignore[assignment]
    fs = device_ops.host(system)
    m = _memdev_with_endpoint(fs, memdev)
    free = _available(m, part)
    if size is None:
        if not free:
            raise InvalidRequestError(f"{m.name} has no {part} capacity left to reserve")
        size = free
    if size <= 0 or size % DPA_UNIT:
        raise InvalidRequestError(
            f"size {size}: the kernel reserves DPA in units of 256 MiB; give a multiple of 256M"
        )
    if size > free and not force:
        raise InvalidRequestError(f"{size >> 20} MiB exceeds {m.name}'s free {part} capacity "
                                  f"({free >> 20} MiB)")  # fmt: skip
    auto = next((d for d in m.decoders if not d.dpa_size), None)
    target = _pick(
        m,
        decoder,
        auto,
        force,
        "every endpoint decoder holds DPA already; free one first (pycxl memdev free-dpa)",
    )
    if target.region:
        raise InvalidRequestError(f"{target.name} belongs to {target.region}; pick another")
    dev = f"{CXL_DEVICES}/{target.name}"
    steps: list[Step] = []
    if target.mode != part:
        back = ((f"{dev}/mode", target.mode),) if target.mode in PARTITION_MODES else ()
        steps.append(write(f"{target.name} decodes {part}", f"{dev}/mode", part, *back))
    steps.append(write(f"reserve {size >> 20} MiB of {m.name}'s {part} DPA on {target.name}",
                       f"{dev}/dpa_size", str(size), (f"{dev}/dpa_size", "0")))  # fmt: skip
    return _finish(fs, m, target, Plan(f"reserve-dpa {m.name}", tuple(steps)), dry_run)


def free_dpa(
    memdev: str, *, mode: str | None = None, decoder: str | None = None, force: bool = False,
    system: device_ops.Host | None = None, dry_run: bool = False,
) -> DeviceResult:  # fmt: skip
    """Free the DPA of ``memdev``'s newest reservation that no region uses (of ``mode``
    where given)."""
    memdev, force = device_ops.name(memdev, "memdev"), device_ops.flag(force, "force")
    dry_run = device_ops.flag(dry_run, "dry_run")
    decoder = None if decoder is None else device_ops.name(decoder, "decoder")
    part = None if mode is None else word(mode, "type", PARTITION_MODES)
    fs = device_ops.host(system)
    m = _memdev_with_endpoint(fs, memdev)
    auto, none = _newest_reservation(m, part)
    target = _pick(m, decoder, auto, force, none)
    if not target.dpa_size:
        raise InvalidRequestError(f"{target.name} holds no DPA: nothing to free")
    if target.region:
        raise InvalidRequestError(f"{target.name}'s DPA belongs to {target.region}: destroy "
                                  f"that region to free it (pycxl region destroy "
                                  f"{target.region})")  # fmt: skip
    dev = f"{CXL_DEVICES}/{target.name}"
    step = write(f"free {target.dpa_size >> 20} MiB of {m.name}'s {target.mode} DPA on "
                 f"{target.name}", f"{dev}/dpa_size", "0",
                 (f"{dev}/dpa_size", str(target.dpa_size)))  # fmt: skip
    return _finish(fs, m, target, Plan(f"free-dpa {m.name}", (step,)), dry_run)


def _finish(fs: Sysfs, m: Memdev, target: Decoder, plan: Plan, dry_run: bool) -> DeviceResult:
    done = device_ops.run(fs, m.name, plan, dry_run=dry_run, what="changing DPA reservations")
    after = device_ops.topology(fs) if done else None
    dec = after.decoder(target.name) if after is not None else target
    mem = after.memdev(m.name) if after is not None else m
    return DeviceResult(m.name, plan, done, memdev=mem, details={"decoder": dec})
