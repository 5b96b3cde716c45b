"""Memory bandwidth monitoring (Intel RDT MBM, AMD PQoS) through resctrl: the bytes
the CPUs of each L3 cache domain moved to and from memory (``mbm_total_bytes``), and to
and from their own socket's memory (``mbm_local_bytes``), read from every monitoring
group's ``mon_data`` so that the whole host is counted. A domain's figures go to the
node of its CPUs: ``mbm_local`` is that node's memory as its own CPUs use it."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from ..base.errors import NeedsRootError
from ..base.sysfs import Sysfs
from .base import MBM_LOCAL, MBM_TOTAL, Key, Missing, Reading, Subject

RESCTRL = "/sys/fs/resctrl"
CPU_DIR = "/sys/devices/system/cpu"
CPUINFO = "/proc/cpuinfo"
FILES = {MBM_TOTAL: "mbm_total_bytes", MBM_LOCAL: "mbm_local_bytes"}
FIGURES = tuple(FILES)


class Resctrl:
    """The monitoring groups' byte counts, summed per node."""

    source = "resctrl"

    def __init__(self, fs: Sysfs, domains: Mapping[str, int], missing: dict[Key, Missing]) -> None:
        self.fs = fs
        self.domains = domains  # mon_L3_XX -> node
        self.missing = missing

    def read(self) -> Reading:
        """Every domain's bytes so far, summed over the monitoring groups, per node."""
        totals: dict[Key, float] = {}
        missing = dict(self.missing)
        for group in _groups(self.fs):
            for domain, node in self.domains.items():
                for figure, name in FILES.items():
                    key: Key = (("node", node), figure)
                    try:
                        text = self.fs.read(f"{group}/mon_data/{domain}/{name}")
                    except NeedsRootError:
                        missing[key] = Missing("needs-root", "resctrl's counts are root's here")
                        continue
                    if text is None or not text.strip().isdecimal():
                        # 'Unavailable' while the counter is being set up, or 'Error'
                        missing[key] = Missing("unavailable", f"resctrl says {text!r} for "
                                               f"{domain}/{name}")  # fmt: skip
                        continue
                    totals[key] = totals.get(key, 0.0) + int(text)
        for key in missing:
            totals.pop(key, None)
        methods: dict[Subject, str] = {("node", n): "resctrl MBM (its CPUs' traffic)"
                                       for n in set(self.domains.values())}  # fmt: skip
        return Reading(self.source, time.monotonic(), totals=totals, missing=missing,
                       methods=methods)  # fmt: skip

    def close(self) -> None:
        """Nothing to let go of."""


def open_reader(fs: Sysfs, cpu_nodes: Mapping[int, int], nodes: Sequence[int]) -> Resctrl:
    """resctrl's memory bandwidth counters for ``nodes`` (the nodes with CPUs), or the
    reason each is missing."""
    why = _unusable(fs)
    if why is not None:
        return Resctrl(fs, {}, {(("node", n), f): why for n in nodes for f in FIGURES})
    domains = {}
    l3 = _l3_ids(fs, cpu_nodes)
    for name in fs.listdir(f"{RESCTRL}/mon_data"):
        if name.startswith("mon_L3_") and name[7:].isdecimal():
            node = l3.get(int(name[7:]))
            if node is not None:
                domains[name] = node
    missing: dict[Key, Missing] = {}
    for n in nodes:
        if n not in domains.values():
            why = Missing("no-domain", f"resctrl has no L3 domain for node {n}'s CPUs")
            missing.update({(("node", n), f): why for f in FIGURES})
    return Resctrl(fs, domains, missing)


def _unusable(fs: Sysfs) -> Missing | None:
    if fs.is_dir(f"{RESCTRL}/mon_data"):
        features = fs.read(f"{RESCTRL}/info/L3_MON/mon_features") or ""
        if "mbm_total_bytes" not in features.split():
            return Missing("no-MBM", "resctrl monitors no memory bandwidth on this host "
                           "(info/L3_MON/mon_features lists no mbm_total_bytes)")  # fmt: skip
        return None
    flags = next((line for line in fs.iter_lines(CPUINFO) if line.startswith("flags")), "")
    if "cqm_mbm_total" in flags.split():
        return Missing("not-mounted", "resctrl is not mounted: mount -t resctrl resctrl "
                       "/sys/fs/resctrl (as root)")  # fmt: skip
    vm = " (a VM rarely passes it through)" if "hypervisor" in flags.split() else ""
    return Missing("no-MBM", f"this CPU reports no memory bandwidth monitoring (no cqm_mbm_total "
                   f"flag){vm}")  # fmt: skip


def _groups(fs: Sysfs) -> list[str]:
    """The root group and every control group: each one's mon_data counts its tasks
    (with its monitoring groups), so together they count every task."""
    out = [RESCTRL]
    for name in fs.listdir(RESCTRL):
        if name not in ("info", "mon_groups", "mon_data") and fs.is_dir(
            f"{RESCTRL}/{name}/mon_data"
        ):
            out.append(f"{RESCTRL}/{name}")
    return out


def _l3_ids(fs: Sysfs, cpu_nodes: Mapping[int, int]) -> dict[int, int]:
    """L3 cache id -> the node of the CPUs sharing it."""
    out: dict[int, int] = {}
    for cpu, node in cpu_nodes.items():
        base = f"{CPU_DIR}/cpu{cpu}/cache"
        for index in fs.listdir(base):
            if fs.read_int(f"{base}/{index}/level") == 3:
                cache = fs.read_int(f"{base}/{index}/id")
                if cache is not None:
                    out.setdefault(cache, node)
    return out
