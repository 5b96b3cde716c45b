"""Memdevs, ports and buses taken out of service and back: their drivers unbound and
bound again (ndctl's ``disable-memdev``, ``enable-memdev``, ``disable-port``,
``enable-port`` and ``disable-bus``).

Before any write: a memdev whose endpoint still decodes (an active region) is not
disabled, nor a port or bus above one, without ``force``; a root port is disabled only
as its bus. Each unbind is undone by a bind if a later step fails.
"""

from __future__ import annotations

from ..base.errors import InvalidRequestError, NotAvailableError, NotFoundError, OperationError
from ..base.plan import Plan, Step, write
from ..base.sysfs import Sysfs
from ..base.values import is_digits
from . import device_ops
from .device_ops import CXL_DEVICES, DeviceResult
from .model import Memdev, Port
from .read import bus_present
from .topology import CxlTopology

MEMDEV_DRIVER = "/sys/bus/cxl/drivers/cxl_mem"
PORT_DRIVER = "/sys/bus/cxl/drivers/cxl_port"
BUS_DRIVER = "/sys/bus/platform/drivers/cxl_acpi"  # a CXL root is an ACPI0017 platform device
# where a platform device is: its bus's links, and the device itself (all a tree may hold)
PLATFORM_DEVICES = "/sys/bus/platform/devices"
PLATFORM = "/sys/devices/platform"


def _unbind(driver: str, device: str, what: str) -> Step:
    return write(what, f"{driver}/unbind", device, (f"{driver}/bind", device))


def _bind(driver: str, device: str, what: str) -> Step:
    return write(what, f"{driver}/bind", device, (f"{driver}/unbind", device))


def _decoding(topo: CxlTopology, memdevs: list[Memdev]) -> list[str]:
    """'mem0 (region0)' for each memdev whose endpoint has committed decoders."""
    out = []
    for m in memdevs:
        ep = m.endpoint
        if ep is not None and ep.decoders_committed:
            regions = ", ".join(r.name for r in m.regions) or "a region"
            out.append(f"{m.name} ({regions})")
    return out


def _refuse_active(what: str, busy: list[str], force: bool) -> list[str]:
    """Refuse (or, with force, warn) where memdevs still decode an active region."""
    if not busy:
        return []
    text = (f"{what} would take {', '.join(busy)} out of an active region: its memory "
            "would vanish under whatever uses it")  # fmt: skip
    if not force:
        raise InvalidRequestError(
            f"{text}; destroy or disable the region first (pycxl region destroy), or pass "
            "--force if that is intended"
        )
    return [f"forced: {text}"]


def disable_memdev(
    memdev: str,
    *,
    force: bool = False,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Unbind ``memdev`` from cxl_mem (its endpoint port goes away); one in an active
    region only with ``force``. A memdev already disabled is left as it is."""
    memdev, force = device_ops.name(memdev, "memdev"), device_ops.flag(force, "force")
    dry_run = device_ops.flag(dry_run, "dry_run")
    fs = device_ops.host(system)
    topo = device_ops.topology(fs)
    m = topo.find_memdev(memdev)
    warnings = _refuse_active(f"disabling {m.name}", _decoding(topo, [m]), force)
    steps = (_unbind(MEMDEV_DRIVER, m.name, f"unbind {m.name} from cxl_mem"),) if m.enabled else ()
    plan = Plan(f"disable {m.name}", steps)
    done = device_ops.run(fs, m.name, plan, dry_run=dry_run, what="disabling a memdev")
    after = device_ops.memdev_after(fs, m.name) if done else m
    if done and after is not None and after.enabled:
        raise OperationError(f"{m.name} is still enabled after the unbind: the kernel kept it")
    return DeviceResult(m.name, plan, done, memdev=after, warnings=tuple(warnings))


def enable_memdev(
    memdev: str,
    *,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Bind ``memdev`` to cxl_mem (its endpoint port comes back)."""
    memdev, dry_run = device_ops.name(memdev, "memdev"), device_ops.flag(dry_run, "dry_run")
    fs = device_ops.host(system)
    m = device_ops.topology(fs).find_memdev(memdev)
    steps = () if m.enabled else (_bind(MEMDEV_DRIVER, m.name, f"bind {m.name} to cxl_mem"),)
    plan = Plan(f"enable {m.name}", steps)
    done = device_ops.run(fs, m.name, plan, dry_run=dry_run, what="enabling a memdev")
    after = device_ops.memdev_after(fs, m.name) if done else m
    if done and after is not None and not after.enabled:
        raise OperationError(
            f"{m.name} did not come up after the bind (the cxl_mem driver refused it: see "
            "dmesg; its port above may be disabled: pycxl port enable)"
        )
    return DeviceResult(m.name, plan, done, memdev=after)


def find_port(topo: CxlTopology, name: str, *, endpoint: bool = False) -> Port:
    """A port by name (port1, or 1); with ``endpoint``, an endpoint port (endpoint2 or
    2, or the memdev it represents)."""
    pool = topo.endpoints if endpoint else topo.ports
    prefix = "endpoint" if endpoint else "port"
    ident = f"{prefix}{name}" if is_digits(name) else name
    for p in pool:
        if ident in (p.name, p.host if endpoint else None):
            return p
    kind = "endpoint port" if endpoint else "port"
    raise NotFoundError(kind, name, [p.name for p in pool])


def _below(topo: CxlTopology, port: Port) -> list[Memdev]:
    """The memdevs whose endpoints hang at or below ``port``."""
    names = set()
    for ep in topo.endpoints:
        p: Port | None = ep
        while p is not None:
            if p.name == port.name:
                names.add(ep.host)
                break
            p = topo.port(p.parent) if p.parent else None
    return [m for m in topo.memdevs if m.name in names]


def disable_port(
    port: str,
    *,
    endpoint: bool = False,
    force: bool = False,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Unbind a switch or host-bridge port (or, with ``endpoint``, an endpoint port)
    from cxl_port; the endpoints below it go with it. Refused over an active region
    without ``force``; a root port is disabled as its bus (``disable_bus``)."""
    port, endpoint = device_ops.name(port, "port"), device_ops.flag(endpoint, "endpoint")
    force, dry_run = device_ops.flag(force, "force"), device_ops.flag(dry_run, "dry_run")
    fs = device_ops.host(system)
    topo = device_ops.topology(fs)
    p = find_port(topo, port, endpoint=endpoint)
    if p.kind == "root":
        raise InvalidRequestError(f"{p.name} is a CXL root: disable it as a bus (pycxl bus "
                                  f"disable {p.name})")  # fmt: skip
    below = _below(topo, p)
    warnings = _refuse_active(f"disabling {p.name}", _decoding(topo, below), force)
    steps: list[Step] = []
    if p.kind == "endpoint":
        # unbinding an endpoint port alone deletes it and leaves its memdev bound with no
        # endpoint to come back to; through the memdev, the endpoint goes and comes back
        m = topo.memdev(p.host)
        said = f"unbind {m.name} from cxl_mem (its endpoint {p.name} goes with it)"
        steps = [_unbind(MEMDEV_DRIVER, m.name, said)] if m.enabled else []
        plan = Plan(f"disable {p.name}", tuple(steps))
        done = device_ops.run(fs, p.name, plan, dry_run=dry_run, what="disabling a port")
        return DeviceResult(p.name, plan, done, details={"memdevs": [m.name]},
                            warnings=tuple(warnings))  # fmt: skip
    if p.enabled:
        # the memdevs below first, as ndctl asks: the kernel removes their endpoints
        # with the port but leaves the memdevs bound, with no endpoint to come back to
        steps += [_unbind(MEMDEV_DRIVER, m.name, f"unbind {m.name} from cxl_mem (below {p.name})")
                  for m in below if m.enabled]  # fmt: skip
    if p.enabled:
        steps.append(_unbind(PORT_DRIVER, p.name, f"unbind {p.name} from cxl_port"))
    plan = Plan(f"disable {p.name}", tuple(steps))
    done = device_ops.run(fs, p.name, plan, dry_run=dry_run, what="disabling a port")
    gone = [m.name for m in below]
    return DeviceResult(p.name, plan, done, details={"memdevs": gone}, warnings=tuple(warnings))


def enable_port(
    port: str, *, endpoint: bool = False, enable_memdevs: bool = False,
    system: device_ops.Host | None = None, dry_run: bool = False,
) -> DeviceResult:  # fmt: skip
    """Bind a port to cxl_port; with ``enable_memdevs``, also bind the memdevs below it
    that are disabled (their endpoints come back)."""
    port, endpoint = device_ops.name(port, "port"), device_ops.flag(endpoint, "endpoint")
    enable_memdevs = device_ops.flag(enable_memdevs, "enable_memdevs")
    dry_run = device_ops.flag(dry_run, "dry_run")
    fs = device_ops.host(system)
    topo = device_ops.topology(fs)
    if endpoint:
        return _enable_endpoint(fs, topo, port, dry_run)
    p = find_port(topo, port, endpoint=endpoint)
    steps: list[Step] = []
    if not p.enabled:
        steps.append(_bind(PORT_DRIVER, p.name, f"bind {p.name} to cxl_port"))
    if enable_memdevs:
        downstream = _downstream_memdevs(fs, topo, p)
        steps += [_bind(MEMDEV_DRIVER, m.name, f"bind {m.name} to cxl_mem")
                  for m in downstream if not m.enabled]  # fmt: skip
    plan = Plan(f"enable {p.name}", tuple(steps))
    done = device_ops.run(fs, p.name, plan, dry_run=dry_run, what="enabling a port")
    return DeviceResult(p.name, plan, done)


def _enable_endpoint(fs: Sysfs, topo: CxlTopology, name: str, dry_run: bool) -> DeviceResult:
    """An endpoint comes back with its memdev's driver: named by the endpoint while it
    exists, by the memdev once it has gone (disabling it deletes it)."""
    p = next((e for e in topo.endpoints if name in (e.name, e.host)), None)
    m = topo.memdev_or_none(p.host if p is not None else name)
    if m is None:
        raise NotFoundError("endpoint port", name, [e.name for e in topo.endpoints] +
                            [x.name for x in topo.memdevs],
                            problem="a disabled endpoint is gone: name its memdev")  # fmt: skip
    steps: list[Step] = []
    if p is not None and not p.enabled:
        steps.append(_bind(PORT_DRIVER, p.name, f"bind {p.name} to cxl_port"))
    if not m.enabled:
        steps.append(_bind(MEMDEV_DRIVER, m.name, f"bind {m.name} to cxl_mem (its endpoint "
                                                  "comes back with it)"))  # fmt: skip
    target = p.name if p is not None else m.name
    plan = Plan(f"enable {target}", tuple(steps))
    done = device_ops.run(fs, target, plan, dry_run=dry_run, what="enabling a port")
    return DeviceResult(target, plan, done, memdev=device_ops.memdev_after(fs, m.name) if done
                        else m)  # fmt: skip


def _downstream_memdevs(fs: Sysfs, topo: CxlTopology, port: Port) -> list[Memdev]:
    """Memdevs whose device sits below the device ``port`` stands for (its host bridge
    or switch), found by path: a disabled port shows no dports, and a disabled memdev
    has no endpoint to follow."""
    out = []
    for m in topo.memdevs:
        path = fs.realpath(f"{CXL_DEVICES}/{m.name}").split("/")
        if port.host in path or m in _below(topo, port):
            out.append(m)
    return out


def disable_bus(
    bus: str,
    *,
    force: bool = False,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Unbind a CXL root's platform device from cxl_acpi: every port, endpoint and
    region under it goes away until it is bound again (``enable_bus``)."""
    bus, force = device_ops.name(bus, "bus"), device_ops.flag(force, "force")
    dry_run = device_ops.flag(dry_run, "dry_run")
    fs = device_ops.host(system)
    topo = device_ops.topology(fs)
    root = _find_bus(topo, bus)
    below = _below(topo, root)
    warnings = _refuse_active(f"disabling {root.name}", _decoding(topo, below), force)
    plan = Plan(f"disable {root.name}",
                (_unbind(BUS_DRIVER, root.host, f"unbind {root.host} ({root.name}) from "
                                                "cxl_acpi"),))  # fmt: skip
    done = device_ops.run(fs, root.name, plan, dry_run=dry_run, what="disabling a bus")
    return DeviceResult(root.name, plan, done, details={"memdevs": [m.name for m in below]},
                        warnings=tuple(warnings))  # fmt: skip


def enable_bus(
    host: str = "ACPI0017:00",
    *,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Bind a CXL root's platform device (``ACPI0017:00``) to cxl_acpi again: the ports
    and memdevs under it are enumerated afresh. ``host`` may also name the bus (root0)
    or its provider (ACPI.CXL), as ``disable_bus`` takes it."""
    host, dry_run = device_ops.name(host, "host"), device_ops.flag(dry_run, "dry_run")
    fs = device_ops.host(system)
    topo = device_ops.topology(fs) if bus_present(fs) else None
    root = _bus_or_none(topo, host) if topo is not None else None
    name = root.host if root is not None else host
    if fs.exists(f"{PLATFORM_DEVICES}/{name}"):  # the platform bus says who holds it
        bound = fs.exists(f"{PLATFORM_DEVICES}/{name}/driver")
    elif root is not None or fs.exists(f"{PLATFORM}/{name}"):
        # a tree without the platform bus: the root port is there while cxl_acpi holds
        # the device, and only then
        bound = root is not None
    else:
        roots = {d for base in (PLATFORM_DEVICES, PLATFORM) for d in fs.listdir(base)
                 if d.startswith("ACPI0017")}  # fmt: skip
        if not roots:  # nothing to bind: no CXL at all, as every device command says it
            raise NotAvailableError(
                "no CXL root device (ACPI0017) on this system: the platform describes no CXL "
                "host bridge, so there is no bus to enable"
            )
        known = roots | ({b.name for b in topo.buses} if topo is not None else set())
        raise NotFoundError("CXL root device", host, known)
    steps = () if bound else (_bind(BUS_DRIVER, name, f"bind {name} to cxl_acpi"),)
    plan = Plan(f"enable {name}", steps)
    done = device_ops.run(fs, name, plan, dry_run=dry_run, what="enabling a bus")
    return DeviceResult(name, plan, done)


def _bus_or_none(topo: CxlTopology, name: str) -> Port | None:
    try:
        return _find_bus(topo, name)
    except NotFoundError:
        return None


def _find_bus(topo: CxlTopology, name: str) -> Port:
    """A root port by bus name (root0), provider (ACPI.CXL) or host (ACPI0017:00)."""
    for b in topo.buses:
        if name in (b.name, b.provider) or name == topo.port(b.port).host:
            return topo.port(b.port)
    raise NotFoundError("bus", name, [b.name for b in topo.buses])
