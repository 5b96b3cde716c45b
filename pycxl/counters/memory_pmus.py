"""Memory read and written per node, counted where the memory is: the uncore memory
controllers of each socket (Intel's ``uncore_imc``: ``cas_count_read`` and
``cas_count_write``, whose sysfs scale and unit make them bytes) and the CXL devices'
own performance monitoring units (``cxl_pmu_memX.Y``: data returned to the host,
``s2m_drs_memdata``, and writes received, ``m2s_rwd_memwr`` and ``m2s_rwd_memwrptl``;
each message carries one 64-byte line).

Uncore controllers count a socket; their counts go to the node of the CPU the kernel
names in the PMU's cpumask. A CXL node's figures are the sums of its memdevs', and only
given when every memdev of it can be counted."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..base.sysfs import Sysfs
from .base import MEM_READ, MEM_WRITE, Key, Missing, Reading, Subject
from .perf_event import PerfRefused, open_counter, read_count
from .pmus import Event, pmus, read_event

PARANOID = "/proc/sys/kernel/perf_event_paranoid"
CPUINFO = "/proc/cpuinfo"
IMC = re.compile(r"^uncore_imc(_\d+)?$")
CPMU = re.compile(r"^cxl_pmu_(mem\d+)\.\d+$")
IMC_EVENTS = {MEM_READ: ("cas_count_read",), MEM_WRITE: ("cas_count_write",)}
CPMU_EVENTS = {MEM_READ: ("s2m_drs_memdata",), MEM_WRITE: ("m2s_rwd_memwr", "m2s_rwd_memwrptl")}
LINE = 64  # bytes a CXL.mem data message carries
FIGURES = (MEM_READ, MEM_WRITE)


@dataclass
class _Counter:
    key: Key
    fd: int
    bytes_per_count: float


@dataclass
class MemoryPmus:
    """Open counters of memory controllers and CXL devices, by node."""

    source: str
    counters: list[_Counter] = field(default_factory=list)
    missing: dict[Key, Missing] = field(default_factory=dict)
    methods: dict[Subject, str] = field(default_factory=dict)

    def read(self) -> Reading:
        """Bytes read and written per node since the counters were opened."""
        import time

        totals: dict[Key, float] = {}
        for c in self.counters:
            totals[c.key] = totals.get(c.key, 0.0) + read_count(c.fd).scaled * c.bytes_per_count
        return Reading(self.source, time.monotonic(), totals=totals, missing=dict(self.missing),
                       methods=dict(self.methods))  # fmt: skip

    def close(self) -> None:
        """Close the counters' file descriptors."""
        for c in self.counters:
            os.close(c.fd)
        self.counters.clear()


def open_reader(fs: Sysfs, cpu_nodes: Mapping[int, int], sockets: Sequence[int],
                memdevs_by_node: Mapping[int, Sequence[str]]) -> MemoryPmus:  # fmt: skip
    """Counters of memory read and written: the uncore memory controllers' for
    ``sockets`` (the nodes with CPUs; ``cpu_nodes`` maps each CPU to its node), the CXL
    devices' for each CXL node (the memdevs of its regions in ``memdevs_by_node``)."""
    reader = MemoryPmus("perf")
    _open_imc(reader, fs, cpu_nodes, sockets)
    _open_cxl_pmu(reader, fs, memdevs_by_node)
    return reader


def _open_imc(reader: MemoryPmus, fs: Sysfs, cpu_nodes: Mapping[int, int],
              nodes: Sequence[int]) -> None:  # fmt: skip
    names = [p for p in pmus(fs) if IMC.match(p)]
    if not names:
        _all_missing(reader, nodes, _no_imc(fs))
        return
    try:
        for pmu in names:
            for figure, events in IMC_EVENTS.items():
                for event in _events(fs, pmu, events):
                    if event.bytes_per_count is None:
                        continue  # a count in a unit that is not bytes: not this figure
                    for cpu in event.cpus or (0,):
                        node = cpu_nodes.get(cpu)
                        if node is not None:
                            _open(reader, (("node", node), figure), event, cpu,
                                  event.bytes_per_count)  # fmt: skip
    except PerfRefused as e:
        reader.close()  # the first source opened: every counter so far is its own
        _all_missing(reader, nodes, refusal(fs, e))
        return
    counted = {c.key for c in reader.counters}
    for node in nodes:
        for figure in FIGURES:
            if (("node", node), figure) not in counted:
                reader.missing[(("node", node), figure)] = Missing(
                    "no-IMC", f"no uncore_imc counter of node {node}'s socket counts "
                    f"{'reads' if figure == MEM_READ else 'writes'} (cas_count_*)")  # fmt: skip
        if any(k[0] == ("node", node) for k in counted):
            reader.methods[("node", node)] = (
                f"uncore_imc counters of the socket ({len(names)} PMUs)"
            )


def _open_cxl_pmu(reader: MemoryPmus, fs: Sysfs,
                  memdevs_by_node: Mapping[int, Sequence[str]]) -> None:  # fmt: skip
    by_memdev: dict[str, list[str]] = {}
    for p in pmus(fs):
        m = CPMU.match(p)
        if m:
            by_memdev.setdefault(m.group(1), []).append(p)
    for node, memdevs in memdevs_by_node.items():
        subject: Subject = ("node", node)
        why = _cpmu_gaps(fs, memdevs, by_memdev)
        if why is not None:
            _all_missing(reader, [node], why)
            continue
        opened = []
        try:
            for memdev in memdevs:
                for figure, events in CPMU_EVENTS.items():
                    for pmu in by_memdev[memdev]:
                        for event in _events(fs, pmu, events):
                            opened.append(_open(reader, (subject, figure), event,
                                                (event.cpus or (0,))[0], LINE))  # fmt: skip
        except PerfRefused as e:
            for c in opened:
                os.close(c.fd)
                reader.counters.remove(c)
            _all_missing(reader, [node], refusal(fs, e))
            continue
        reader.methods[subject] = "cxl_pmu of " + ", ".join(memdevs)


def _cpmu_gaps(fs: Sysfs, memdevs: Sequence[str], by_memdev: Mapping[str, list[str]]
               ) -> Missing | None:  # fmt: skip
    """Why a node's CXL traffic cannot be counted whole, or None when it can."""
    if not memdevs:
        return Missing("no-memdev", "no CXL memdev feeds this node (a node mapped to CXL by "
                       "name, or a region pycxl cannot see)")  # fmt: skip
    lacking = [m for m in memdevs if m not in by_memdev]
    if lacking:
        return Missing("no-CPMU", f"the kernel registered no cxl_pmu PMU for {', '.join(lacking)} "
                       "(the device has no performance monitoring unit, or the cxl_pmu driver "
                       "is not loaded: modprobe cxl_pmu)")  # fmt: skip
    for m in memdevs:
        for events in CPMU_EVENTS.values():
            if not any(_events(fs, p, events) for p in by_memdev[m]):
                return Missing("no-event", f"{m}'s CXL PMU does not count {' or '.join(events)}")
    return None


def _events(fs: Sysfs, pmu: str, names: Sequence[str]) -> list[Event]:
    return [e for n in names if (e := read_event(fs, pmu, n)) is not None]


def _open(reader: MemoryPmus, key: Key, event: Event, cpu: int, per_count: float) -> _Counter:
    c = _Counter(key, open_counter(event.type, event.config[0], cpu, event.config[1],
                                   event.config[2]), per_count)  # fmt: skip
    reader.counters.append(c)
    return c


def _all_missing(reader: MemoryPmus, nodes: Sequence[int], why: Missing) -> None:
    for node in nodes:
        for figure in FIGURES:
            reader.missing[(("node", node), figure)] = why


def _no_imc(fs: Sysfs) -> Missing:
    flags = next((line for line in fs.iter_lines(CPUINFO) if line.startswith("flags")), "")
    if "hypervisor" in flags.split():
        return Missing("no-PMU", "this VM has no memory-controller counters: hypervisors do "
                       "not pass the uncore PMU through (no uncore_imc PMU)")  # fmt: skip
    return Missing("no-PMU", "the kernel registered no uncore_imc PMU (Intel server CPUs with "
                   "the intel_uncore driver: modprobe intel_uncore; pycxl reads no other "
                   "vendor's memory-controller counters)")  # fmt: skip


def refusal(fs: Sysfs, e: PerfRefused) -> Missing:
    """Why the kernel refused a system-wide counter, in words."""
    if e.errno in (errno.EACCES, errno.EPERM):
        level = fs.read_int(PARANOID)
        if os.geteuid() != 0 and level is not None and level > 0:
            return Missing(
                f"paranoid-{level}",
                f"kernel.perf_event_paranoid is {level}: "
                "system-wide counters need it at 0 or below, or root (CAP_PERFMON)",
            )
        if os.geteuid() != 0:
            return Missing("needs-root", "system-wide counters need root (CAP_PERFMON)")
        return Missing("refused", f"the kernel refused the counter even to root ({e}): a "
                       "container or a locked-down kernel")  # fmt: skip
    return Missing("refused", f"the kernel refused the counter ({e})")
