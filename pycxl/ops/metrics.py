"""The metrics ``pycxl check`` and ``pycxl stat`` export for Prometheus (names without
the ``pycxl_`` prefix, which ``prometheus.render`` adds). The list is documented in
docs/operations.md; names and labels are stable.

They follow node_exporter's conventions: base units in the name (``_bytes``,
``_seconds``, ``_transfers_per_second``, ``_ratio``), ``_total`` on counters only, the
labels ``node`` (a NUMA node id, as node_exporter's ``node_memory_numa_*`` carry it),
``memdev`` and ``region``. What node_exporter already exports per node (``MemTotal``,
``MemFree``, ``numa_hit``... with ``--collector.meminfo_numa``) is not exported again:
``pycxl_node_info`` gives each node its tier name to join with them.
"""

from __future__ import annotations

import time

from ..cxl.health import Health
from ..cxl.mailbox import Unsupported
from ..system import System
from .check import SEVERITIES, CheckReport
from .prometheus import Metric
from .stat import StatReport

STATUS_CODES = {"ok": 0, "no-cxl": 0, "warning": 1, "failure": 2}


def check_metrics(report: CheckReport, system: System) -> list[Metric]:
    """Check outcome, findings, memdevs with their health, regions, PCIe links."""
    status = Metric("check_status", "Worst finding of the last check: 0 ok, 1 warning, 2 failure")
    status.add(STATUS_CODES[report.status])
    stamp = Metric("check_timestamp_seconds", "When the last check ran (Unix time)")
    stamp.add(time.time())
    counts = Metric("check_findings", "Findings of the last check by severity")
    for sev in SEVERITIES:
        counts.add(sum(1 for f in report.findings if f.severity == sev), severity=sev)
    finding = Metric(
        "check_finding",
        "1 for each warning or failure of the last check, labelled by check and subject",
    )
    for f in report.findings:
        if f.severity in ("warning", "failure"):
            finding.add(1, check=f.check, subject=f.subject, severity=f.severity, **f.labels)

    enabled = Metric("memdev_enabled", "1 when the memdev's driver is bound")
    ram = Metric("memdev_ram_bytes", "Volatile capacity of the memdev")
    healthy = Metric("memdev_health_ok", "1 when the device reports no health problem")
    supported = Metric("memdev_health_supported", "1 when the device answers Get Health Info")
    life = Metric("memdev_life_used_ratio", "Device life used (0-1), as the device reports it")
    temp = Metric("memdev_temperature_celsius", "Device temperature, as the device reports it")
    dirty = Metric("memdev_dirty_shutdowns_total", "Dirty shutdowns the device counted", "counter")
    vol = Metric(
        "memdev_corrected_volatile_errors_total",
        "Corrected volatile memory errors the device counted",
        "counter",
    )
    poison = Metric("memdev_poison_records", "Records in the device's poison list")
    lab: dict[str, str | int | None]
    for m in system.cxl.memdevs:
        lab = {"memdev": m.name, "serial": None if m.serial is None else hex(m.serial)}
        enabled.add(m.enabled, **lab)
        ram.add(m.ram_size, **lab)
        dh = report.health.get(m.name)
        if dh is not None:
            h = dh.health
            supported.add(not isinstance(h, Unsupported), **lab)
            if isinstance(h, Health):
                healthy.add(not h.problems, **lab)
                life.add(None if h.life_used == 0xFF else h.life_used / 100, **lab)
                temp.add(None if h.temperature == -1 else h.temperature, **lab)
                dirty.add(h.dirty_shutdowns, **lab)
                vol.add(h.volatile_errors, **lab)
        recs = report.poison.get(m.name)
        if isinstance(recs, list):
            poison.add(len(recs), **lab)

    committed = Metric("region_committed", "1 when the region's decoders are committed")
    size = Metric("region_size_bytes", "Size of the region")
    online = Metric("region_memory_blocks_online", "Memory blocks of the region online")
    blocks = Metric("region_memory_blocks", "Memory blocks of the region")
    for r in system.cxl.regions:
        nodes = r.numa_nodes
        node = nodes[0] if nodes else None
        lab = {
            "region": r.name,
            "node": node,
            "target": system.tier_name(node),
        }
        committed.add(r.committed, **lab)
        size.add(r.size, **lab)
        online.add(sum(d.online_memblocks for d in r.dax_devices), **lab)
        blocks.add(sum(d.total_memblocks for d in r.dax_devices), **lab)

    # node_exporter's pcidevice collector (1.9+) names and units, for the same facts
    speed = Metric("pcie_link_transfers_per_second", "PCIe link speed now (T/s per lane)")
    max_speed = Metric(
        "pcie_link_max_transfers_per_second", "Best speed both ends of the link support (T/s)"
    )
    width = Metric("pcie_link_width", "PCIe lanes now")
    max_width = Metric("pcie_link_max_width", "Most lanes both ends of the link support")
    owners = {m.host: m.name for m in system.cxl.memdevs}
    gpus = {g.pci_bus_id: g.target_name for g in system.gpus.devices}
    for dev, link in report.links.items():
        lab = {
            "device": dev,
            "memdev": owners.get(dev),
            "gpu": None if dev in owners else gpus.get(dev, dev),
        }
        speed.add(None if link.speed is None else link.speed * 1e9, **lab)
        max_speed.add(None if link.max_speed is None else link.max_speed * 1e9, **lab)
        width.add(link.width, **lab)
        max_width.add(link.max_width, **lab)
    return [
        status,
        stamp,
        counts,
        finding,
        enabled,
        ram,
        healthy,
        supported,
        life,
        temp,
        dirty,
        vol,
        poison,
        committed,
        size,
        online,
        blocks,
        speed,
        max_speed,
        width,
        max_width,
    ]


# node counters exported as they are (pages), by their kernel names; numa_hit, numa_miss
# and numa_foreign are node_exporter's (node_memory_numa_numa_*_total), not repeated here
NODE_COUNTER_METRICS = {
    "promoted": ("node_promoted_pages_total", "Pages promoted to the node (pgpromote_success)"),
    "demoted": ("node_demoted_pages_total", "Pages demoted from the node (pgdemote_*)"),
}
SYSTEM_COUNTER_METRICS = {
    "pgmigrate_success": ("pages_migrated_total", "Pages migrated (all reasons)"),
    "pgmigrate_fail": ("page_migrations_failed_total", "Page migrations that failed"),
    "numa_pages_migrated": ("numa_pages_migrated_total", "Pages NUMA balancing migrated"),
    "numa_hint_faults": ("numa_hint_faults_total", "NUMA-balancing hint faults"),
    "numa_hint_faults_local": (
        "numa_hint_faults_local_total",
        "NUMA-balancing hint faults on the local node",
    ),
}


def stat_metrics(report: StatReport) -> list[Metric]:
    """Node names and tiers, pins and tiering counters; system migration counters;
    tiering state; when the report was made."""
    stamp = Metric("stat_timestamp_seconds", "When the last stat report was made (Unix time)")
    stamp.add(time.time())
    info = Metric(
        "node_info",
        "1 for each NUMA node, with its tier name: join with node_exporter's "
        "node_memory_numa_* on the node label",
    )
    pinned = Metric("node_pinned_bytes", "Memory of the node held by long-term pins now")
    tier = Metric("node_memory_tier", "The kernel's memory tier id of the node")
    counters = {k: Metric(n, h, "counter") for k, (n, h) in NODE_COUNTER_METRICS.items()}
    for n in report.nodes:
        lab: dict[str, str | int | None] = {"node": n.node, "target": n.name, "tier": n.tier}
        info.add(1, **lab)
        pinned.add(n.pinned, **lab)
        tier.add(n.memory_tier, **lab)
        for key, metric in counters.items():
            metric.add(n.totals.get(key), **lab)
    system = []
    for key, (name, help_text) in SYSTEM_COUNTER_METRICS.items():
        m = Metric(name, help_text, "counter")
        m.add(report.system_totals.get(key))
        system.append(m)
    state = []
    t = report.tiering
    if t is not None:
        demotion = Metric("demotion_enabled", "1 when the kernel demotes to slower tiers")
        demotion.add(t.demotion_enabled)
        balancing = Metric("numa_balancing_mode", "1 for the NUMA-balancing mode in force")
        if t.numa_balancing is not None:
            balancing.add(1, mode=t.numa_balancing)
        weight = Metric("interleave_weight", "Weighted-interleave weight of the node")
        for node, w in t.weights.items():
            weight.add(w, node=node)
        pmu = Metric("cxl_pmus", "CXL performance monitoring units the kernel registered")
        pmu.add(len(t.cxl_pmus))
        state = [demotion, balancing, weight, pmu]
    return [stamp, info, pinned, tier, *counters.values(), *system, *state]
