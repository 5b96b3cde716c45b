"""``pycxl check``: what would make a job on this host slow or wrong, as findings with
a severity and a fix.

Without expectations it checks consistency: every memdev enabled and healthy, in a
region, every region committed with its memory online, the zone of each CXL node
against GPU pinning, PCIe links at their best speed and width, device health (the
mailbox, the monitor's event log) and poison. Expectations (``cxl0=512G``,
``regions=2``, ``memdevs=4``) add what the job needs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..errors import InvalidRequestError, NeedsRootError, NotFoundError, OperationError
from ..pci import nvidia_gpus
from ..pcie import Link, read_link
from ..sysfs import Sysfs
from ..system import System
from ..tiers import token
from ..units import format_size, parse_size
from ..values import read_text

if TYPE_CHECKING:  # imported where used: a host without CXL memdevs needs none of them
    from ..cxl.health import DeviceHealth, Health
    from ..cxl.mailbox import Unsupported
    from ..cxl.model import Memdev, Region
    from ..cxl.poison import PoisonRecord

Severity = Literal["ok", "info", "warning", "failure"]
SEVERITIES: tuple[Severity, ...] = ("ok", "info", "warning", "failure")
# a node may show a little less than it was given: the kernel's memmap of the memory
# can live on the memory itself (memmap_on_memory), 64 bytes per 4 KiB page
CAPACITY_SLACK = 0.97
DEFAULT_EVENT_LOG = "/var/log/pycxl/events.jsonl"
_EXPECT = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*=\s*(\S+)\s*$")
_COUNTS = ("regions", "memdevs")


@dataclass(frozen=True)
class Finding:
    """One result of a check: how bad, about what, what was seen, what to do."""

    severity: Severity
    check: str  # short id: memdev-enabled, health, region-online, pcie-link...
    subject: str  # mem0, region0, cxl0, 0000:1b:00.0, host
    message: str
    fix: str = ""
    labels: dict[str, str] = field(default_factory=dict, hash=False)  # memdev, region, node...

    def as_json(self) -> dict[str, Any]:
        """One finding as JSON: severity, check, subject, message, fix, labels."""
        return {
            "severity": self.severity,
            "check": self.check,
            "subject": self.subject,
            "message": self.message,
            "fix": self.fix or None,
            "labels": self.labels,
        }


@dataclass(frozen=True)
class Expectations:
    """What the job needs: node capacities by name, and counts of regions and memdevs."""

    capacities: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """No expectation given: check consistency only."""
        return not self.capacities and not self.counts


def parse_expectations(items: Iterable[str], source: str = "--expect") -> Expectations:
    """``cxl0=512G``, ``regions=2``, ``memdevs=4``: InvalidRequestError names a bad one."""
    caps: dict[str, int] = {}
    counts: dict[str, int] = {}
    for item in items:
        m = _EXPECT.match(item)
        if not m:
            raise InvalidRequestError(
                f"{source} {item!r}: write NAME=SIZE (cxl0=512G), regions=N or memdevs=N"
            )
        key, value = m.group(1), m.group(2)
        if key in _COUNTS:
            if not value.isdecimal():
                raise InvalidRequestError(f"{source} {item!r}: {key} takes a whole number")
            counts[key] = int(value)
            continue
        if token(key).kind not in ("dram", "cxl", "node"):  # names as typed: lower case
            raise InvalidRequestError(
                f"{source} {item!r}: {key} is not a memory node name (dram0, cxl0, node2) "
                "nor regions/memdevs"
            )
        try:
            caps[key] = parse_size(value)
        except InvalidRequestError as e:
            raise InvalidRequestError(f"{source} {item!r}: {e}") from None
    return Expectations(caps, counts)


def read_expect_file(path: str) -> list[str]:
    """The expectations in a file: one per line, '#' starts a comment."""
    lines = read_text(path, "expectation file").splitlines()
    return [ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip()]


@dataclass(frozen=True)
class CheckReport:
    """Every finding, and what was read on the way (for --json and the textfile)."""

    findings: tuple[Finding, ...]
    cxl_present: bool
    expected: bool = False  # expectations were given (and checked)
    health: dict[str, DeviceHealth] = field(default_factory=dict, hash=False)
    poison: dict[str, list[PoisonRecord] | Unsupported] = field(default_factory=dict, hash=False)
    links: dict[str, Link] = field(default_factory=dict, hash=False)

    @property
    def worst(self) -> Severity:
        """The worst severity found ('ok' when nothing is wrong)."""
        return max((f.severity for f in self.findings), key=SEVERITIES.index, default="ok")

    @property
    def status(self) -> str:
        """failure, warning, no-cxl (nothing wrong, but nothing CXL to check and nothing
        expected) or ok. Expectations that all held are ok, CXL or not: a job that
        asked only for dram0=1G on a host without CXL has what it needs."""
        worst = self.worst
        if worst in ("failure", "warning"):
            return worst
        return "ok" if self.cxl_present or self.expected else "no-cxl"


def run_check(
    system: System,
    expectations: Expectations | None = None,
    *,
    event_log: str | None = None,
    device_health: bool = True,
    fs: Sysfs | None = None,
    dev_dir: str = "/dev/cxl",
) -> CheckReport:
    """Check this host. ``event_log``: the JSON lines ``pycxl monitor --log`` writes
    (default: DEFAULT_EVENT_LOG when it exists; '' for none). ``device_health=False``
    skips the mailbox and the poison list (they need root). The report's status is
    no-cxl only when nothing is wrong, there is no CXL memory and nothing was expected.
    A system read from a recorded tree asks no device: its memdevs are not this
    machine's."""
    device_health = device_health and not system.recorded
    fs = fs or Sysfs()
    exp = expectations or Expectations()
    out: list[Finding] = []
    cxl = system.cxl
    memdevs = [m for m in cxl.memdevs]
    if not cxl.present or not memdevs:
        out.append(
            Finding(
                "info",
                "cxl-present",
                "host",
                "no CXL memory devices: "
                + (cxl.NO_BUS if not cxl.present else "the CXL bus has no memdevs"),
                "load the CXL drivers (modprobe cxl_acpi cxl_pci cxl_mem) if the "
                "host has CXL memory",
            )
        )
    for m in memdevs:
        out += _memdev_findings(m)
        out += _operation_findings(fs, m)
    for r in cxl.regions:
        out += _region_findings(system, r)
        out += _socket_findings(system, r)
    out += _zone_findings(system, fs)
    out += _expectation_findings(system, exp)
    links = _links(system, fs)
    out += _link_findings(system, links)
    health: dict[str, DeviceHealth] = {}
    poison: dict[str, list[PoisonRecord] | Unsupported] = {}
    if memdevs and device_health:
        health, poison, found = _device_findings(system, fs, dev_dir)
        out += found
    if event_log:  # given: a file that is not the monitor's log is the caller's error
        events: list[dict[str, Any]] | Finding = read_event_log(event_log)
    elif event_log is None and os.path.exists(fs.path(DEFAULT_EVENT_LOG)):
        try:
            events = read_event_log(fs.path(DEFAULT_EVENT_LOG))
        except InvalidRequestError as e:
            events = Finding("warning", "events", "host", str(e),
                             "check what writes there (pycxl monitor --log)")  # fmt: skip
    else:  # '' turns the log off
        events = []
    if isinstance(events, Finding):
        out.append(events)
    elif memdevs:
        out += _event_findings(memdevs, events, health)
    return CheckReport(tuple(out), bool(memdevs), not exp.empty, health, poison, links)


def read_event_log(path: str) -> list[dict[str, Any]]:
    """The records of the event log ``pycxl monitor --log`` writes, one JSON object per
    line. A last line cut short (a crash while writing) is skipped; any other line that
    is not a JSON object is an InvalidRequestError naming the file and the line."""
    import json  # only where there is a log: check runs at the top of job scripts

    text = read_text(path, "event log")
    lines = text.split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        record: Any = None
        try:
            record = json.loads(line)
        except ValueError:
            if i == last and not text.endswith("\n"):
                continue  # cut short
        if not isinstance(record, dict):
            raise InvalidRequestError(
                f"event log {path}: line {i + 1} is not a JSON object ({line[:40]!r}); "
                "give the file pycxl monitor --log writes"
            )
        records.append(record)
    return records


# --- CXL objects ----------------------------------------------------------------------
def _memdev_labels(m: Memdev) -> dict[str, str]:
    return {"memdev": m.name, "serial": "" if m.serial is None else hex(m.serial)}


def _memdev_findings(m: Memdev) -> list[Finding]:
    labels = _memdev_labels(m)
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


def _operation_findings(fs: Sysfs, m: Memdev) -> list[Finding]:
    """What device operations left running on ``m``: a sanitize, a firmware update."""
    labels = _memdev_labels(m)
    out = []
    state = fs.read(f"/sys/bus/cxl/devices/{m.name}/security/state")
    if state == "sanitize":
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


def _alert_finding(memdev: str, cfg: Any, labels: dict[str, str]) -> Finding | None:
    """The warning thresholds someone set on the device (set-alert-config), if any."""
    from ..cxl.alerts import ALERTS
    from ..cxl.health import AlertConfig

    if not isinstance(cfg, AlertConfig) or not cfg.valid:
        return None
    values = cfg.as_json()
    on = [f"{name.replace('_', ' ')} at {values[key]}"
          for (name, (bit, _, _)), key in zip(ALERTS.items(), _ALERT_KEYS, strict=True)
          if cfg.valid & bit]  # fmt: skip
    return Finding("info", "alert-config", memdev,
                   f"{memdev}: warning alerts set: {', '.join(on)}", "", labels)  # fmt: skip


_ALERT_KEYS = (
    "life_used_prog_warn_threshold",
    "dev_over_temperature_prog_warn_threshold",
    "dev_under_temperature_prog_warn_threshold",
    "corrected_volatile_mem_err_prog_warn_threshold",
    "corrected_pmem_err_prog_warn_threshold",
)


def _socket_findings(system: System, r: Region) -> list[Finding]:
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


def _region_findings(system: System, r: Region) -> list[Finding]:
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


def _zone_findings(system: System, fs: Sysfs) -> list[Finding]:
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


def _expectation_findings(system: System, exp: Expectations) -> list[Finding]:
    out = []
    for name, want in exp.capacities.items():
        try:
            target = system.resolve(name)
        except NotFoundError:
            out.append(
                Finding(
                    "failure",
                    "capacity",
                    name,
                    f"{name} is expected with {format_size(want)} and is not present",
                    "pycxl list: see which memory this host has",
                    {"target": name},
                )
            )
            continue
        node = target.node
        tier = system.tier(node) if node is not None else None
        have = tier.node.mem_total if tier is not None else 0
        labels = {"target": name} | ({} if node is None else {"node": str(node)})
        if have < want * CAPACITY_SLACK:
            out.append(
                Finding(
                    "failure",
                    "capacity",
                    name,
                    f"{name} has {format_size(have)} online; {format_size(want)} expected",
                    "pycxl region create / enable to bring it online",
                    labels,
                )
            )
        else:
            out.append(
                Finding(
                    "ok",
                    "capacity",
                    name,
                    f"{name} has {format_size(have)} ({format_size(want)} expected)",
                    "",
                    labels,
                )
            )
    have_counts = {"regions": len(system.cxl.regions), "memdevs": len(system.cxl.memdevs)}
    for key, want_n in exp.counts.items():
        have_n = have_counts[key]
        sev: Severity = "ok" if have_n == want_n else "failure"
        out.append(
            Finding(
                sev,
                f"{key}-count",
                "host",
                f"{have_n} {key} ({want_n} expected)",
                "" if sev == "ok" else "pycxl list: see what this host has",
            )
        )
    return out


# --- PCIe links -----------------------------------------------------------------------
def _links(system: System, fs: Sysfs) -> dict[str, Link]:
    devices = [m.host for m in system.cxl.memdevs]
    gpus = [g.pci_bus_id for g in system.gpus.devices] or nvidia_gpus(fs)
    out = {}
    for dev in [*devices, *gpus]:
        link = read_link(dev, fs)
        if link is not None:
            out[dev] = link
    return out


def _link_findings(system: System, links: dict[str, Link]) -> list[Finding]:
    owners = {m.host: m.name for m in system.cxl.memdevs}
    gpu_names = {g.pci_bus_id: g.target_name for g in system.gpus.devices}
    out = []
    for dev, link in links.items():
        is_gpu = dev not in owners
        who = gpu_names.get(dev, f"GPU {dev}") if is_gpu else f"{owners[dev]} ({dev})"
        labels = {
            "device": dev,
            ("gpu" if is_gpu else "memdev"): gpu_names.get(dev, dev) if is_gpu else owners[dev],
        }
        limit = " (the upstream port's maximum)" if link.limited_by_port else ""
        if link.device_max_unknown:
            limit = " (the device's own maximum is unreadable: the upstream port's is shown)"
        if link.width_below_max:
            out.append(
                Finding(
                    "warning",
                    "pcie-link",
                    who,
                    f"{who} link {link.describe()}{limit}: fewer lanes than both ends support",
                    "reseat the card or check the slot/riser",
                    labels,
                )
            )
        elif link.speed_below_max and is_gpu:
            out.append(
                Finding(
                    "info",
                    "pcie-link",
                    who,
                    f"{who} link {link.describe()}{limit}: GPUs lower the link "
                    "speed when idle; it rises under load",
                    "",
                    labels,
                )
            )
        elif link.speed_below_max:
            out.append(
                Finding(
                    "warning",
                    "pcie-link",
                    who,
                    f"{who} link {link.describe()}{limit}: slower than both ends support",
                    "check the slot, riser and BIOS link settings",
                    labels,
                )
            )
        else:
            out.append(
                Finding("ok", "pcie-link", who, f"{who} link {link.describe()}{limit}", "", labels)
            )
    return out


# --- the devices themselves: mailbox health, poison, monitor's events -----------------
def _device_findings(
    system: System, fs: Sysfs, dev_dir: str
) -> tuple[dict[str, DeviceHealth], dict[str, list[PoisonRecord] | Unsupported], list[Finding]]:
    memdevs = [m for m in system.cxl.memdevs if m.enabled]
    if os.geteuid() != 0:
        return (
            {},
            {},
            [
                Finding(
                    "info",
                    "health",
                    "host",
                    "device health and poison lists were not read: they come from "
                    "the devices' mailboxes, which need root",
                    "run pycxl check as root",
                )
            ],
        )
    # the mailbox and poison code load only where they can be asked (root)
    from ..cxl.health import read_health
    from ..cxl.mailbox import Unsupported
    from ..cxl.poison import read_poison

    out: list[Finding] = []
    health: dict[str, DeviceHealth] = {}
    for m in memdevs:
        labels = _memdev_labels(m)
        try:
            h = read_health(m.name, dev_dir)
        except (OperationError, NeedsRootError) as e:  # this device; the others go on
            out.append(
                Finding(
                    "warning",
                    "health",
                    m.name,
                    f"{m.name}: {e}",
                    "see dmesg for the device's mailbox",
                    labels,
                )
            )
            continue
        health[m.name] = h
        out.append(_health_finding(m.name, h.health, labels, "the device"))
        alerts = _alert_finding(m.name, h.alert_config, labels)
        if alerts is not None:
            out.append(alerts)
    try:
        poison = read_poison([m.name for m in memdevs], fs)
    except (OperationError, NeedsRootError) as e:
        out.append(Finding("warning", "poison", "host", f"poison lists not read: {e}"))
        return health, {}, out
    for m in memdevs:
        labels = _memdev_labels(m)
        recs = poison.get(m.name)
        if isinstance(recs, Unsupported):
            out.append(
                Finding(
                    "info",
                    "poison",
                    m.name,
                    f"{m.name}: no poison list ({recs.reason})",
                    "",
                    labels,
                )
            )
        elif recs:
            where = sorted({_where(system, r) for r in recs})
            injected = sum(r.source == "Injected" for r in recs)
            if injected:  # a test of the alerting path, not a failing device
                where.append(f"({injected} injected: pycxl memdev clear-media-poison)")
            out.append(
                Finding(
                    "warning",
                    "poison",
                    m.name,
                    f"{m.name}: {len(recs)} poisoned range(s) " + ", ".join(where),
                    "reads there fail; the kernel takes such pages offline when it meets them: "
                    "plan to move work off this device",
                    labels,
                )
            )
        elif recs is not None:
            out.append(Finding("ok", "poison", m.name, f"{m.name}: no poison", "", labels))
    return health, poison, out


def _where(system: System, r: PoisonRecord) -> str:
    if r.region is None:
        return f"(dpa {r.dpa:#x}, in no region)"
    region = next((x for x in system.cxl.regions if x.name == r.region), None)
    node = region.numa_nodes[0] if region is not None and region.numa_nodes else None
    name = system.tier_name(node) if node is not None else None
    return f"(dpa {r.dpa:#x} in {r.region}" + (f", {name}" if name else "") + ")"


def _health_finding(
    memdev: str, health: Health | Unsupported, labels: dict[str, str], source: str
) -> Finding:
    from ..cxl.mailbox import Unsupported

    if isinstance(health, Unsupported):
        return Finding(
            "info",
            "health",
            memdev,
            f"{memdev}: {health.command} not answered ({health.reason})",
            "",
            labels,
        )
    problems = health.problems
    if not problems:
        return Finding("ok", "health", memdev, f"{memdev}: healthy (from {source})", "", labels)
    sev: Severity = "failure" if health.critical else "warning"
    return Finding(
        sev,
        "health",
        memdev,
        f"{memdev}: {', '.join(problems)} (from {source})",
        "replace or service the device; move work off it first"
        if sev == "failure"
        else "plan maintenance of the device",
        labels,
    )


def _event_findings(
    memdevs: Sequence[Memdev], events: Sequence[dict[str, Any]], health: dict[str, DeviceHealth]
) -> list[Finding]:
    """The latest memory-module event per device (by serial: names can change across
    boots) in the monitor's log; where the mailbox answered health itself, it wins."""
    from ..cxl.health import event_health
    from ..cxl.mailbox import Unsupported

    latest: dict[int, dict[str, Any]] = {}
    for record in events:
        if record.get("event") == "cxl_memory_module" and isinstance(record.get("serial"), int):
            latest[record["serial"]] = record
    out = []
    for m in memdevs:
        ev = latest.get(m.serial) if m.serial is not None else None
        answered = m.name in health and not isinstance(health[m.name].health, Unsupported)
        if ev is None or answered:
            continue
        out.append(
            _health_finding(
                m.name, event_health(ev), _memdev_labels(m), f"its event of {ev.get('time', '?')}"
            )
        )
    return out
