"""JSON of CXL objects in the field names and value forms of ndctl's ``cxl list``.

Sizes are integers in bytes; with ``human=True`` they become ndctl's '-u' strings and
addresses and serials become hex strings, as ndctl prints them.
"""

from __future__ import annotations

from typing import Any

from ..units import format_size_ndctl
from .model import Bus, DaxDevice, Decoder, Memdev, Port, Region

Json = dict[str, Any]


def _size(n: int, human: bool) -> int | str:
    return format_size_ndctl(n) if human else n


def _hex(n: int, human: bool) -> int | str:
    return hex(n) if human else n


def memdev_json(m: Memdev, human: bool = False) -> Json:
    j: Json = {"memdev": m.name}
    if m.pmem_size:
        j["pmem_size"] = _size(m.pmem_size, human)
    if m.ram_size:
        j["ram_size"] = _size(m.ram_size, human)
    if m.serial is not None:
        j["serial"] = _hex(m.serial, human)
    if m.numa_node is not None:
        j["numa_node"] = m.numa_node
    j["host"] = m.host
    if not m.enabled:
        j["state"] = "disabled"
    # pycxl additions (ndctl prints some of these only with -F / -I)
    if m.firmware_version:
        j["firmware_version"] = m.firmware_version
    if m.payload_max is not None:
        j["payload_max"] = m.payload_max
    if m.label_storage_size is not None:
        j["label_storage_size"] = m.label_storage_size
    if m.ram_qos_class is not None:
        j["ram_qos_class"] = m.ram_qos_class
    if m.pmem_qos_class is not None:
        j["pmem_qos_class"] = m.pmem_qos_class
    return j


def decoder_json(d: Decoder, targets: bool = False, human: bool = False) -> Json:
    j: Json = {"decoder": d.name}
    if d.size and d.resource is not None:
        j["resource"] = _hex(d.resource, human)
    if d.size:
        j["size"] = _size(d.size, human)
    j["interleave_ways"] = d.interleave_ways
    if d.interleave_ways > 1 and d.interleave_granularity is not None:
        j["interleave_granularity"] = d.interleave_granularity
    if d.region:
        j["region"] = d.region
    if not d.size:
        j["state"] = "disabled"
    if d.kind == "endpoint":
        if d.dpa_size and d.dpa_resource is not None:
            j["dpa_resource"] = _hex(d.dpa_resource, human)
        if d.dpa_size:
            j["dpa_size"] = _size(d.dpa_size, human)
        if d.mode and d.mode != "none":
            j["mode"] = d.mode
    if d.kind == "root":
        if d.pmem_capable or d.volatile_capable:
            extent = d.max_available_extent
            if extent is not None:
                j["max_available_extent"] = _size(extent, human)
        if d.pmem_capable:
            j["pmem_capable"] = True
        if d.volatile_capable:
            j["volatile_capable"] = True
        if d.accelmem_capable:
            j["accelmem_capable"] = True
        if d.qos_class is not None and d.qos_class >= 0:
            j["qos_class"] = d.qos_class
    if d.kind != "endpoint":
        j["nr_targets"] = len(d.target_list)
        if targets and d.target_list:
            j["targets"] = [
                {
                    "target": dp.name,
                    **({"alias": dp.alias} if dp.alias else {}),
                    "position": pos,
                    "id": _hex(dp.id, human),
                }
                for pos, dp in enumerate(d.targets)
            ]
    return j


def region_json(r: Region, targets: bool = False, human: bool = False) -> Json:
    j: Json = {"region": r.name}
    if r.resource is not None:
        j["resource"] = _hex(r.resource, human)
    j["size"] = _size(r.size, human)
    j["type"] = r.type
    if r.uuid:
        j["uuid"] = r.uuid
    j["interleave_ways"] = r.interleave_ways
    j["interleave_granularity"] = r.interleave_granularity
    j["decode_state"] = r.decode_state
    if not r.enabled:
        j["state"] = "disabled"
    if targets and r.interleave_ways:
        j["mappings"] = [
            {"position": m.position, **({"memdev": m.memdev} if m.memdev else {}),
             "decoder": m.decoder}
            for m in r.mappings
        ]  # fmt: skip
    return j


def port_json(p: Port, targets: bool = False, human: bool = False) -> Json:
    key = "endpoint" if p.kind == "endpoint" else "port"
    j: Json = {key: p.name, "host": p.host, "depth": p.depth}
    if not p.enabled:
        j["state"] = "disabled"
    if targets and p.dports:
        j["nr_dports"] = len(p.dports)
        j["dports"] = [
            {"dport": d.name, **({"alias": d.alias} if d.alias else {}), "id": _hex(d.id, human)}
            for d in p.dports
        ]
    return j


def bus_json(b: Bus) -> Json:
    return {"bus": b.name, "provider": b.provider}


def dax_json(d: DaxDevice, human: bool = False) -> Json:
    """daxctl's field names ('chardev', 'target_node', 'online_memblocks'...)."""
    j: Json = {"chardev": d.name, "size": _size(d.size, human)}
    if d.target_node is not None:
        j["target_node"] = d.target_node
    j["mode"] = d.mode
    if d.mode == "system-ram":
        j["online_memblocks"] = d.online_memblocks
        j["total_memblocks"] = d.total_memblocks
        if d.movable is not None:
            j["movable"] = d.movable
    if d.region:
        j["region"] = d.region
    return j
