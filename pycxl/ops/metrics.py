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
from ..resolve.system import System
from .check import SEVERITIES, CheckReport
from .prometheus import Metric
from .stat import StatReport
from .top import TopReport

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


# a GPU link's figures: the counter of bytes since the driver started, or, where NVML only
# samples the link, the bytes per second of the last sample
GPU_LINK_METRICS = {
    "rx": ("gpu_link_receive_bytes", "Bytes the GPU received on the link (host to GPU)"),
    "tx": ("gpu_link_transmit_bytes", "Bytes the GPU sent on the link (GPU to host)"),
}
NODE_MEMORY_METRICS = {
    "mem_read": ("node_memory_read_bytes_total", "Bytes read from the node's memory, at its "
                 "memory controllers or CXL devices, since pycxl top started"),
    "mem_write": ("node_memory_written_bytes_total", "Bytes written to the node's memory, at "
                  "its memory controllers or CXL devices, since pycxl top started"),
}  # fmt: skip


def top_metrics(report: TopReport) -> list[Metric]:
    """GPU link counters (or sampled rates), their links' bandwidth, GPU memory busy;
    node memory read and written, resctrl's bytes, the nodes' memory bandwidth; when the
    report was made. Page traffic is node_exporter's (meminfo_numa) and pycxl stat's."""
    from ..counters.base import HBM_BUSY, MBM_LOCAL, MBM_TOTAL
    from .top import GPU_LINKS

    stamp = Metric("top_timestamp_seconds", "When the last pycxl top report was made (Unix time)")
    stamp.add(time.time())
    counters = {d: Metric(f"{n}_total", h, "counter") for d, (n, h) in GPU_LINK_METRICS.items()}
    sampled = {d: Metric(f"{n}_per_second", f"{h}, per second, as NVML last sampled it")
               for d, (n, h) in GPU_LINK_METRICS.items()}  # fmt: skip
    link_max = Metric("gpu_link_max_bytes_per_second",
                      "What the GPU's link carries per direction (PCIe: at the best speed both "
                      "ends support, after line encoding)")  # fmt: skip
    busy = Metric(
        "gpu_memory_busy_ratio",
        "Share of the last sample period the GPU's memory was read or written (NVML)",
    )
    lab: dict[str, str | int | None]
    for g in report.gpus:
        base = {"gpu": g.name, "device": g.pci}
        busy.add(g.value(HBM_BUSY), **base)
        for link, figures in GPU_LINKS.items():
            lab = {**base, "link": link}
            c = g.ceilings.get(link)
            link_max.add(None if c is None else c.bytes_per_s, **lab)
            for direction, figure in zip(("rx", "tx"), figures, strict=True):
                if figure in g.totals:
                    counters[direction].add(g.totals[figure], **lab)
                else:
                    sampled[direction].add(g.value(figure), **lab)
    memory = {f: Metric(n, h, "counter") for f, (n, h) in NODE_MEMORY_METRICS.items()}
    mbm = Metric(
        "node_mbm_bytes_total",
        "Bytes the node's CPUs moved to and from memory, as "
        "resctrl counts them (scope local: the node's own memory; all: any)",
        "counter",
    )
    node_max = Metric(
        "node_memory_max_bytes_per_second",
        "What the node's memory carries (a CXL node: its memdevs' PCIe links per direction; "
        "a node with CPUs: the read bandwidth HMAT advertises)",
    )
    for n in report.nodes:
        lab = {"node": n.id, "target": n.name, "tier": n.tier}
        for figure, metric in memory.items():
            metric.add(n.totals.get(figure), **lab)
        mbm.add(n.totals.get(MBM_LOCAL), **lab, scope="local")
        mbm.add(n.totals.get(MBM_TOTAL), **lab, scope="all")
        c = n.ceilings.get("memory")
        node_max.add(None if c is None else c.bytes_per_s, **lab)
    return [
        stamp,
        *counters.values(),
        *sampled.values(),
        link_max,
        busy,
        *memory.values(),
        mbm,
        node_max,
    ]
