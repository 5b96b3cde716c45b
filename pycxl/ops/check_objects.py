"""Findings about the CXL objects themselves: memdevs enabled and in a region, device
operations left running, regions committed and online, regions across sockets, and the
zone of each CXL node against GPU pinning."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base.sysfs import Sysfs
from ..base.units import format_size
from ..cxl.read import SANITIZING, security_state
from ..pci.devices import nvidia_gpus
from ..resolve.system import System
from .check_finding import Finding, Severity, memdev_labels

if TYPE_CHECKING:
    from ..cxl.model import Memdev, Region


def memdev_findings(m: Memdev) -> list[Finding]:
    """A memdev disabled, or with capacity in no region."""
    labels = memdev_labels(m)
    if not m.enabled:
        return [
            Finding(
                "failure",
                "memdev-enabled",
                m.name,
                f"{m.name} is disabled: its driver is not bound",
                f"cxl enable-memdev {m.name}; if it stays disabled, see dmesg",
                labels,
            )
        ]
    out = [Finding("ok", "memdev-enabled", m.name, f"{m.name} enabled", "", labels)]
    if m.ram_size and not m.regions:
        out.append(
            Finding(
                "warning",
                "memdev-in-region",
                m.name,
                f"{m.name}'s {format_size(m.ram_size)} is in no region: the host cannot use it",
                "pycxl region create (see pycxl region create --help)",
                labels,
            )
        )
    return out


def operation_findings(fs: Sysfs, m: Memdev) -> list[Finding]:
    """What device operations left running on ``m``: a sanitize, a firmware update."""
    labels = memdev_labels(m)
    out = []
    if security_state(fs, m.name) == SANITIZING:
        out.append(Finding("warning", "sanitize", m.name,
                           f"{m.name} is being sanitized: its media is unusable until it ends",
                           f"pycxl memdev wait-sanitize {m.name}", labels))  # fmt: skip
    if fs.exists(f"/sys/class/firmware/{m.name}/loading"):
        from ..cxl.firmware import loader_state

        loader = loader_state(fs, m.name)
        if loader.busy:
            out.append(Finding("warning", "firmware", m.name,
                               f"{m.name}'s firmware update is under way ({loader.status}, "
                               f"{loader.remaining} bytes to go)",
                               f"pycxl memdev update-firmware {m.name} --cancel to abort it",
                               labels))  # fmt: skip
    return out


def socket_findings(system: System, r: Region) -> list[Finding]:
    """A region interleaved over memdevs of several sockets: allowed where a window
    interleaves their host bridges, but every CPU then reaches part of its lines over
    the link between the sockets, and it has no one nearest socket."""
    sockets = r.memdev_nodes
    if len(sockets) < 2:
        return []
    names = ", ".join(system.tier_name(n) or f"node{n}" for n in sockets)
    return [
        Finding(
            "info",
            "region-sockets",
            r.name,
            f"{r.name} interleaves memdevs of {len(sockets)} sockets ({names}): every CPU "
            "reaches part of its lines through the other socket",
            "if each socket's jobs should use their own CXL memory: one region per socket "
            "(pycxl region create on each socket's memdevs)",
            {"region": r.name, "sockets": names},
        )
    ]


def region_findings(system: System, r: Region) -> list[Finding]:
    """A region not committed, without a dax device, or with memory offline."""
    labels = {"region": r.name}
    if not r.committed:
        return [
            Finding(
                "failure",
                "region-committed",
                r.name,
                f"{r.name} is not committed: its decoders do not route memory",
                f"pycxl region enable {r.name}, or destroy and create it again",
                labels,
            )
        ]
    daxes = r.dax_devices
    if not daxes:
        return [
            Finding(
                "failure",
                "region-online",
                r.name,
                f"{r.name} is committed but has no dax device (region driver unbound?)",
                f"pycxl region enable {r.name}",
                labels,
            )
        ]
    out = []
    for d in daxes:
        node = d.target_node
        lab = labels | {"node": str(node), "target": system.tier_name(node) or ""}
        if d.mode == "devdax":
            out.append(
                Finding(
                    "ok",
                    "region-online",
                    r.name,
                    f"{r.name}: {d.name} is a device-dax device (not a NUMA node)",
                    "",
                    lab,
                )
            )
        elif d.mode != "system-ram":
            out.append(
                Finding(
                    "warning",
                    "region-online",
                    r.name,
                    f"{r.name}: {d.name} is bound to no driver: its memory is unused",
                    f"pycxl region enable {r.name}",
                    lab,
                )
            )
        elif d.online_memblocks < d.total_memblocks:
            out.append(
                Finding(
                    "failure",
                    "region-online",
                    r.name,
                    f"{r.name}: {d.total_memblocks - d.online_memblocks} of {d.total_memblocks} "
                    f"memory blocks of {d.name} are offline",
                    f"pycxl region enable {r.name}",
                    lab,
                )
            )
        else:
            name = system.tier_name(node) or f"node{node}"
            out.append(
                Finding(
                    "ok",
                    "region-online",
                    r.name,
                    f"{r.name} online as {name} ({format_size(d.size)}, {d.zone or '?'} zone)",
                    "",
                    lab,
                )
            )
    return out


def zone_findings(system: System, fs: Sysfs) -> list[Finding]:
    """Each CXL node's zone: a movable one loses GPU-pinned pages to DRAM (a warning
    where there is a GPU)."""
    gpus = system.gpus.devices or nvidia_gpus(fs)
    out = []
    for t in system.nodes:
        if t.tier != "cxl" or t.zone is None:
            continue
        labels = {"node": str(t.node.id), "target": t.name, "tier": t.tier}
        if t.holds_longterm_pins:
            out.append(
                Finding(
                    "ok",
                    "zone",
                    t.name,
                    f"{t.name} is in the {t.zone} zone: GPU-pinned memory stays on it",
                    "",
                    labels,
                )
            )
            continue
        sev: Severity = "warning" if gpus else "info"
        out.append(
            Finding(
                sev,
                "zone",
                t.name,
                f"{t.name} is in the {t.zone} zone: memory pinned for a GPU there is moved to "
                "DRAM by the kernel" + ("" if gpus else " (no GPU here)"),
                f"pycxl region enable {t.region} --zone normal (or --mode devdax)",
                labels,
            )
        )
    return out
