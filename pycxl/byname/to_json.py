"""JSON of every object pycxl shows, built here and nowhere else (as ndctl's json.c).

CXL objects use the field names and value forms of ndctl's ``cxl list`` (dax devices:
``daxctl list``); NUMA nodes and GPUs use the same style. Each kind has one schema: the
same keys every time, ``null`` where a value is absent or does not apply to the object
(a root decoder has no ``dpa_size``), or was not asked for (``mappings`` without
``targets=True``). Sizes are integers in bytes; with ``human=True`` they become ndctl's
'-u' strings, and addresses and serials hex strings, as ndctl prints them.

The results and reports have their JSON here too (plans, weight tunings, pin probes,
memdev mailbox replies, benchmark results, stat, top, check findings, host labels): the
classes stay plain data, and each kind's keys are written in one function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base.jsontype import Json
from ..base.units import format_size_ndctl
from ..numa.access import cpu_figures

if TYPE_CHECKING:  # the CXL model loads where there is CXL, not for every list --json
    from ..base.plan import Plan, Step
    from ..cxl.health import AlertConfig, FirmwareInfo, Health
    from ..cxl.model import Bus, DaxDevice, Decoder, Memdev, Port, Region
    from ..cxl.poison import PoisonRecord
    from ..cxl.regions import RegionResult
    from ..gpu.inventory import GpuDevice
    from ..numa.access import AccessFigures
    from ..pci.caps import CxlCapability, Unread
    from ..pci.link import Link
    from ..resolve.tiers import NodeTier
    from .facade import PinProbe
    from .tuning import WeightTuning


def _size(n: int | None, human: bool) -> int | str | None:
    if n is None:
        return None
    return format_size_ndctl(n) if human else n


def _hex(n: int | None, human: bool) -> int | str | None:
    if n is None:
        return None
    return hex(n) if human else n


def _state(enabled: bool) -> str:
    return "enabled" if enabled else "disabled"


def memdev_json(m: Memdev, human: bool = False) -> Json:
    """A memdev in ndctl's fields."""
    return {
        "memdev": m.name,
        "pmem_size": _size(m.pmem_size, human),
        "ram_size": _size(m.ram_size, human),
        "serial": _hex(m.serial, human),
        "numa_node": m.numa_node,
        "host": m.host,
        "state": _state(m.enabled),
        # ndctl prints these only with -F / -I
        "firmware_version": m.firmware_version,
        "payload_max": m.payload_max,
        "label_storage_size": m.label_storage_size,
        "ram_qos_class": m.ram_qos_class,
        "pmem_qos_class": m.pmem_qos_class,
        # ndctl v84+: absent where debugfs cannot say
        **_present("poison_injectable", m.poison_injectable),
    }


def _present(key: str, value: object) -> Json:
    """``{key: value}``, or nothing where the kernel has no such attribute (as ndctl)."""
    return {} if value is None else {key: value}


def decoder_json(d: Decoder, targets: bool = False, human: bool = False) -> Json:
    """A decoder in ndctl's fields; ``targets`` adds its target list."""
    root, endpoint = d.kind == "root", d.kind == "endpoint"
    extent = d.max_available_extent if root and (d.pmem_capable or d.volatile_capable) else None
    return {
        "decoder": d.name,
        "resource": _hex(d.resource, human) if d.size else None,
        "size": _size(d.size, human),
        "interleave_ways": d.interleave_ways,
        "interleave_granularity": d.interleave_granularity,
        "region": d.region,
        "state": _state(d.enabled),
        # endpoint decoders
        "dpa_resource": _hex(d.dpa_resource, human) if endpoint and d.dpa_size else None,
        "dpa_size": _size(d.dpa_size, human) if endpoint else None,
        "mode": d.mode if endpoint else None,
        # root decoders
        "max_available_extent": _size(extent, human),
        "pmem_capable": d.pmem_capable if root else None,
        "volatile_capable": d.volatile_capable if root else None,
        "accelmem_capable": d.accelmem_capable if root else None,
        "qos_class": d.qos_class if root and d.qos_class is not None and d.qos_class >= 0 else None,
        # root and switch decoders
        "nr_targets": None if endpoint else len(d.target_list),
        "targets": [
            {"target": dp.name, "alias": dp.alias, "position": pos, "id": _hex(dp.id, human)}
            for pos, dp in enumerate(d.targets)
        ]
        if targets and not endpoint
        else None,
    }


def advertised_json(f: AccessFigures | None) -> Json | None:
    """What the platform advertises for CPUs (HMAT, CDAT); null where it says nothing."""
    if f is None:
        return None
    return {
        "access_class": f.access_class,  # 1: CPU initiators; 0: any initiator
        "initiators": list(f.initiators),  # the nodes the figures are for ([]: not named)
        "read_latency_ns": f.read_latency_ns,
        "write_latency_ns": f.write_latency_ns,
        "read_bytes_per_s": f.read_bytes_per_s,
        "write_bytes_per_s": f.write_bytes_per_s,
    }


def region_json(r: Region, targets: bool = False, human: bool = False) -> Json:
    """A region in ndctl's fields; ``targets`` adds its mappings. pycxl adds where its
    memdevs hang off and what the platform advertises for it."""
    return {
        "region": r.name,
        "resource": _hex(r.resource, human),
        "size": _size(r.size, human),
        "type": r.type,
        "uuid": r.uuid,
        "interleave_ways": r.interleave_ways,
        "interleave_granularity": r.interleave_granularity,
        "decode_state": r.decode_state,
        "state": _state(r.enabled),
        "mappings": [
            {"position": m.position, "memdev": m.memdev, "decoder": m.decoder} for m in r.mappings
        ]
        if targets
        else None,
        "memdev_nodes": r.memdev_nodes,  # the sockets (nodes) of its memdevs' host bridges
        "advertised": advertised_json(cpu_figures(r.access)),
        **_present("extended_linear_cache_size", _size(r.extended_linear_cache_size, human)),
        **_present("locked", r.locked),
    }


def region_result_json(r: RegionResult) -> Json:
    """What a region operation did (or, dry, would do): its action, the plan of a dry
    run, the layout a create decided, and the region as read back, with its node, tier
    and zone (``pycxl region ... --json``)."""
    doc: Json = {"region": r.name, "action": r.plan.action}
    if not r.executed:
        doc["dry_run"] = True
        doc["plan"] = plan_json(r.plan)
    if r.layout is not None:
        lay = r.layout
        doc["layout"] = {
            "decoder": lay.root.name, "type": lay.type, "size": lay.size,
            "interleave_ways": lay.ways, "interleave_granularity": lay.granularity,
            "targets": [{"position": t.position, "memdev": t.memdev.name,
                         "decoder": t.decoder.name} for t in lay.targets],
        }  # fmt: skip
    if r.executed and r.region is not None:
        from ..cxl.memory_blocks import HOLDS_LONGTERM_PINS

        doc.update(region_json(r.region, targets=True))
        doc["numa_node"] = r.numa_node
        doc["tier"] = r.tier
        doc["zone"] = r.zone
        doc["longterm_pin"] = HOLDS_LONGTERM_PINS.get(r.zone or "")
        doc["dax"] = [{"chardev": d.name, "mode": d.mode} for d in r.region.dax_devices]
    if r.warnings:
        doc["warnings"] = list(r.warnings)
    return doc


def port_json(p: Port, targets: bool = False, human: bool = False) -> Json:
    """A port or endpoint in ndctl's fields; ``targets`` adds its dports."""
    key = "endpoint" if p.kind == "endpoint" else "port"
    return {
        key: p.name,
        "host": p.host,
        "depth": p.depth,
        "state": _state(p.enabled),
        "nr_dports": len(p.dports),
        "dports": [
            {
                "dport": d.name,
                "alias": d.alias,
                "id": _hex(d.id, human),
                **_present("protocol_injectable", d.protocol_injectable),
            }
            for d in p.dports
        ]
        if targets
        else None,
    }


def bus_json(b: Bus) -> Json:
    """A bus (CXL root) in ndctl's fields."""
    return {"bus": b.name, "provider": b.provider,
            **_present("injectable_protocol_errors",
                       None if b.injectable_protocol_errors is None
                       else list(b.injectable_protocol_errors))}  # fmt: skip


def dax_json(d: DaxDevice, human: bool = False) -> Json:
    """daxctl's field names ('chardev', 'target_node', 'online_memblocks'...)."""
    ram = d.mode == "system-ram"
    return {
        "chardev": d.name,
        "size": _size(d.size, human),
        "target_node": d.target_node,
        "mode": d.mode,
        "online_memblocks": d.online_memblocks if ram else None,
        "total_memblocks": d.total_memblocks if ram else None,
        "movable": d.movable if ram else None,
        "zone": d.zone if ram else None,
        "region": d.region,
    }


def node_json(nt: NodeTier) -> Json:
    """A NUMA node with its tier: ids, CPUs, memory in bytes, distances by node id."""
    n = nt.node
    return {
        "node": n.id,
        "name": nt.name,
        "tier": nt.tier,
        "cpus": list(n.cpus),
        "mem_total": n.mem_total,
        "mem_free": n.mem_free,
        "mem_available": n.mem_available,
        "region": nt.region,  # the CXL region feeding it
        "explicit": nt.explicit,  # named CXL by PYCXL_CXL_NODES, not by the topology
        "zone": nt.zone,  # CXL memory's zone: movable, normal, mixed
        "longterm_pin": nt.holds_longterm_pins,  # GPU-registered pages stay on the node
        "distances": {str(k): v for k, v in n.distances.items()},
        "near_node": nt.near,  # the node with CPUs nearest it (itself if it has CPUs)
        "near_by": nt.near_by,  # self, memdevs (their host bridges' socket) or distance
        "memdev_nodes": list(nt.memdev_nodes),  # CXL: the sockets its memdevs hang off
        "advertised": advertised_json(n.advertised),
    }


def pcie_link_json(link: Link | None) -> Json | None:
    """A PCIe link as lspci -vv reads it: now (LnkSta) against the device's own maximum
    (LnkCap), the most both ends support, and the bytes per second it carries each way."""
    if link is None:
        return None
    return {
        "speed_gts": link.speed,
        "width": link.width,
        "cap_speed_gts": link.device_max_speed,
        "cap_width": link.device_max_width,
        "max_speed_gts": link.max_speed,  # what the device and its upstream port both do
        "max_width": link.max_width,
        "downgraded": link.downgraded,
        "bytes_per_s": None if (bw := link.bandwidth()) is None else round(bw),
        "lspci": link.lspci_text(),
    }


def cxl_capability_json(cap: CxlCapability | Unread | None) -> Json | None:
    """A device's PCIe DVSEC for CXL Devices (lspci's CXLCap and CXLCtl); for one that
    could not be read, why."""
    from ..pci.caps import Unread

    if cap is None:
        return None
    if isinstance(cap, Unread):
        return {"unread": cap.reason}
    return {
        "dvsec_revision": cap.revision,
        "cache_capable": cap.cache,
        "io_capable": cap.io,
        "mem_capable": cap.mem,
        "mem_hw_init": cap.mem_hw_init,
        "hdm_count": cap.hdm_count,
        "viral_capable": cap.viral,
        "cache_enabled": cap.cache_enabled,
        "io_enabled": cap.io_enabled,
        "mem_enabled": cap.mem_enabled,
        "lspci": cap.lspci_text(),
    }


def gpu_json(g: GpuDevice) -> Json:
    """A GPU: identity, memory, nearest node, and what matters for host memory; null for
    what its source cannot tell (``source``: nvml, procfs or cuda)."""
    return {
        "gpu": g.target_name,
        "ordinal": g.ordinal,
        "name": g.name,
        "uuid": g.uuid,
        "pci_bus_id": g.pci_bus_id,
        "total_memory": g.total_memory,
        "sm_count": g.sm_count,
        "sm_count_source": g.sm_count_source,
        "compute_capability": g.cc_text,
        "numa_node": g.numa_node,
        "numa_node_source": g.numa_node_source,
        "source": g.source,
        # what matters for host memory: zero-copy mapping, pageable access, registration
        "can_map_host_memory": g.can_map_host_memory,
        "pageable_memory_access": g.pageable_memory_access,
        "host_register_supported": g.host_register_supported,
        "unified_addressing": g.unified_addressing,
        "async_engines": g.async_engines,
        "l2_cache": g.l2_cache,
    }


# plans, tunings and pin probes


def step_json(s: Step) -> dict[str, str | None]:
    """A plan's step: what it does, the path it writes and the value."""
    return {"description": s.description, "path": s.path, "value": s.value}


def plan_json(p: Plan) -> list[dict[str, str | None]]:
    """A plan as the list of its steps (``--dry-run --json``)."""
    return [step_json(s) for s in p.steps]


def tuning_json(t: WeightTuning) -> Json:
    """A weight tuning: the rule, each tier's figures, the plan, and the weights to undo it."""
    total = sum(m.bytes_per_s for m in t.measured) or 1.0
    return {
        "initiator": t.initiator,
        "cpus": list(t.cpus),
        "rule": t.rule,
        "mode": t.mode,
        "turns_auto_off": t.turns_auto_off,
        "tiers": [
            {
                "name": m.name,
                "node": m.node,
                "bytes_per_s": m.bytes_per_s,
                "share": m.bytes_per_s / total,
                "weight": t.weights[m.node],
                "previous_weight": t.previous.get(m.node),
                "advertised_bytes_per_s": m.result.advertised_bytes_per_s,
            }
            for m in t.measured
        ],
        "plan": plan_json(t.plan),
        "undo": t.names(t.previous),
    }


def pin_probe_json(p: PinProbe) -> Json:
    """A long-term pin probe: tier, node, zone, pages, where they were after the pin."""
    pl = p.placement
    return {
        "tier": p.tier, "node": p.node, "zone": p.zone, "pages": pl.pages,
        "pages_on_node": pl.on_expected,
        "moved_to": {str(n): c for n, c in sorted(pl.moved_to.items())},
        "longterm_pin": p.holds,
    }  # fmt: skip


# memdev mailbox replies and media errors (ndctl's objects)


def health_json(h: Health) -> Json:
    """ndctl's ``health`` object (``cxl list -H``)."""
    from ..cxl.health import HEALTH_STATUS_BITS, MEDIA_STATUS

    j: Json = {k: bool(h.health_status & b) for k, b in HEALTH_STATUS_BITS.items()}
    j |= {name: h.media_status == code for code, name in MEDIA_STATUS.items()}
    j |= {
        "ext_life_used": h.ext(0),
        "ext_temperature": h.ext(2),
        "ext_corrected_volatile": h.ext_flag(4),
        "ext_corrected_persistent": h.ext_flag(5),
        "life_used_percent": None if h.life_used == 0xFF else h.life_used,
        "temperature": None if h.temperature == -1 else h.temperature,
        "dirty_shutdowns": h.dirty_shutdowns,
        "volatile_errors": h.volatile_errors,
        "pmem_errors": h.pmem_errors,
    }
    return j


def alert_config_json(a: AlertConfig) -> Json:
    """ndctl's ``alert_config`` object (``cxl list -A``)."""
    from ..cxl.health import ALERT_KINDS

    j: Json = {f"{k}_valid": bool(a.valid & b) for k, b in ALERT_KINDS}
    j |= {f"{k}_writable": bool(a.programmable & b) for k, b in ALERT_KINDS}
    j |= {
        "life_used_crit_alert_threshold": a.life_used_crit,
        "life_used_prog_warn_threshold": a.life_used_warn,
        "dev_over_temperature_crit_alert_threshold": a.over_temp_crit,
        "dev_under_temperature_crit_alert_threshold": a.under_temp_crit,
        "dev_over_temperature_prog_warn_threshold": a.over_temp_warn,
        "dev_under_temperature_prog_warn_threshold": a.under_temp_warn,
        "corrected_volatile_mem_err_prog_warn_threshold": a.volatile_err_warn,
        "corrected_pmem_err_prog_warn_threshold": a.pmem_err_warn,
    }
    return j


def firmware_info_json(f: FirmwareInfo) -> Json:
    """Get FW Info: slots, the active and staged ones, and each slot's revision."""
    return {
        "num_slots": f.slots,
        "active_slot": f.active_slot,
        "staged_slot": f.staged_slot or None,
        "online_activate_capable": f.online_activate,
        "slots": [{"slot": i + 1, "revision": r} for i, r in enumerate(f.revisions) if r],
    }


def poison_record_json(r: PoisonRecord) -> Json:
    """ndctl's media-error fields (offset and length of the device range), plus the
    region and host address."""
    return {
        "offset": r.dpa,
        "length": r.length,
        "source": r.source,
        "region": r.region,
        "hpa": r.hpa,
    }
