"""Build the CXL model from the kernel's sysfs ABI (Documentation/ABI/testing/sysfs-bus-cxl).

Works on any kernel with the CXL drivers, needs no library, and takes a sysroot so the
same code reads recorded trees in tests. One of two backends with one function,
``read_topology``; code above them calls ``pycxl.cxl.read.read_cxl``.
"""

from __future__ import annotations

import os
import re

from ..base.errors import SysfsError
from ..base.sysfs import Sysfs
from ..base.values import PARTITION_MODES, PMEM, RAM, VALID_WAYS
from ..numa.access import read_region_access
from .dax import read_dax_devices
from .model import (
    Bus,
    Decoder,
    Dport,
    Mapping,
    Memdev,
    Port,
    PortKind,
    Region,
)
from .poison import DEBUGFS
from .protocol_errors import EINJ_TYPES, offered_protocol_errors
from .read import CXL_DEVICES, DECODER_NAME, MEMDEV_NAME, PORT_NAME, REGION_NAME, bus_present
from .topology import CxlTopology

_DPORT_RE = re.compile(r"^dport(\d+)$")


def bus_provider(host: str) -> str:
    """ndctl's provider name for a root port's host device."""
    if host.startswith("ACPI0017"):
        return "ACPI.CXL"
    if host.startswith("cxl_acpi"):
        return "cxl_test"
    return host


def read_topology(sysfs: Sysfs | None = None) -> CxlTopology:
    """Read every CXL object the kernel exposes. No CXL bus: ``present`` is False."""
    fs = sysfs or Sysfs()
    if not bus_present(fs):
        dax = read_dax_devices(fs)
        return CxlTopology(present=False, dax_devices=tuple(dax))
    names = fs.listdir(CXL_DEVICES)
    ports = [_read_port(fs, n) for n in names if PORT_NAME.match(n)]
    decoders = [_read_decoder(fs, n) for n in names if DECODER_NAME.match(n)]
    memdevs = [_read_memdev(fs, n) for n in names if MEMDEV_NAME.match(n)]
    endpoint_memdev = {p.name: p.host for p in ports if p.kind == "endpoint"}
    decoder_port = {d.name: d.port for d in decoders}
    regions = [
        _read_region(fs, n, decoder_port, endpoint_memdev) for n in names if REGION_NAME.match(n)
    ]
    offered = offered_protocol_errors(fs)
    buses = [
        Bus(name=p.name, provider=bus_provider(p.host), port=p.name,
            injectable_protocol_errors=offered)
        for p in ports
        if p.kind == "root"
    ]  # fmt: skip
    return CxlTopology.build(
        buses=buses,
        ports=[p for p in ports if p.kind != "endpoint"],
        endpoints=[p for p in ports if p.kind == "endpoint"],
        decoders=decoders,
        memdevs=memdevs,
        regions=regions,
        dax_devices=read_dax_devices(fs),
        source="sysfs",
    )


def _dev(name: str) -> str:
    return f"{CXL_DEVICES}/{name}"


def _parent_port(fs: Sysfs, dev: str) -> str | None:
    parent = os.path.basename(os.path.dirname(fs.realpath(dev)))
    return parent if PORT_NAME.match(parent) else None


def _read_port(fs: Sysfs, name: str) -> Port:
    dev = _dev(name)
    kind = _port_kind(name)
    dports = []
    for entry in fs.listdir(dev):
        m = _DPORT_RE.match(entry)
        if m:
            target = fs.link_target_name(f"{dev}/{entry}") or entry
            # ndctl's 'alias': the dport's firmware (ACPI) node, e.g. ACPI0016:00
            alias = fs.link_target_name(f"{dev}/{entry}/firmware_node")
            dports.append(Dport(name=target, id=int(m.group(1)), alias=alias,
                                protocol_injectable=_einj_at(fs, target)))  # fmt: skip
    dports.sort(key=lambda d: d.id)
    # Depth is the number of ports above this one: root 0, host bridge 1, ...
    depth = sum(1 for part in fs.realpath(dev).split("/")[:-1] if PORT_NAME.match(part))
    return Port(
        name=name,
        kind=kind,
        host=fs.link_target_name(f"{dev}/uport") or "",
        depth=depth,
        parent=_parent_port(fs, dev),
        dports=tuple(dports),
        # The root port has no driver of its own; it is enabled while it exists.
        enabled=kind == "root" or fs.exists(f"{dev}/driver"),
        parent_dport=fs.link_target_name(f"{dev}/parent_dport"),
        decoders_committed=fs.read_int(f"{dev}/decoders_committed"),
    )


def _kind_of_decoder(fs: Sysfs, dev: str) -> str:
    devtype = fs.read(f"{dev}/devtype") or ""
    for kind in ("root", "switch", "endpoint"):
        if devtype == f"cxl_decoder_{kind}":
            return kind
    # Older kernels: infer from the port the decoder sits in.
    return _port_kind(os.path.basename(os.path.dirname(fs.realpath(dev))))


def _port_kind(port_name: str) -> PortKind:
    """root0 -> root, endpoint3 -> endpoint, port1 (host bridge or switch) -> switch."""
    if port_name.startswith("root"):
        return "root"
    return "endpoint" if port_name.startswith("endpoint") else "switch"


def _read_decoder(fs: Sysfs, name: str) -> Decoder:
    dev = _dev(name)
    kind = _kind_of_decoder(fs, dev)
    size = fs.read_int(f"{dev}/size") or 0
    region = fs.read(f"{dev}/region") or None
    return Decoder(
        name=name,
        kind=kind,  # type: ignore[arg-type]
        port=os.path.basename(os.path.dirname(fs.realpath(dev))),
        resource=_address(fs.read_int(f"{dev}/start", root_only=True)),
        size=size,
        interleave_ways=fs.read_int(f"{dev}/interleave_ways") or 1,
        interleave_granularity=fs.read_int(f"{dev}/interleave_granularity"),
        locked=bool(fs.read_bool(f"{dev}/locked")),
        target_type=fs.read(f"{dev}/target_type"),
        target_list=fs.read_int_list(f"{dev}/target_list") or (),
        pmem_capable=bool(fs.read_bool(f"{dev}/cap_pmem")),
        volatile_capable=bool(fs.read_bool(f"{dev}/cap_ram")),
        accelmem_capable=bool(fs.read_bool(f"{dev}/cap_type2")),
        type3_capable=bool(fs.read_bool(f"{dev}/cap_type3")),
        qos_class=fs.read_int(f"{dev}/qos_class") if kind == "root" else None,
        mode=fs.read(f"{dev}/mode") if kind == "endpoint" else None,
        dpa_resource=_address(fs.read_int(f"{dev}/dpa_resource", root_only=True))
        if kind == "endpoint"
        else None,
        dpa_size=fs.read_int(f"{dev}/dpa_size") if kind == "endpoint" else None,
        region=region,
    )


def _read_memdev(fs: Sysfs, name: str) -> Memdev:
    dev = _dev(name)
    numa = fs.read_int(f"{dev}/numa_node")
    return Memdev(
        name=name,
        serial=fs.read_int(f"{dev}/serial"),
        host=os.path.basename(os.path.dirname(fs.realpath(dev))),
        ram_size=fs.read_int(f"{dev}/ram/size") or 0,
        pmem_size=fs.read_int(f"{dev}/pmem/size") or 0,
        numa_node=numa if numa is not None and numa >= 0 else None,
        firmware_version=fs.read(f"{dev}/firmware_version"),
        payload_max=fs.read_int(f"{dev}/payload_max"),
        label_storage_size=fs.read_int(f"{dev}/label_storage_size"),
        ram_qos_class=_qos(fs.read_int(f"{dev}/ram/qos_class")),
        pmem_qos_class=_qos(fs.read_int(f"{dev}/pmem/qos_class")),
        enabled=fs.exists(f"{dev}/driver"),
        poison_injectable=fs.exists(f"{DEBUGFS}/cxl/{name}/inject_poison")
        if fs.exists(f"{DEBUGFS}/cxl")
        else None,
    )


def _einj_at(fs: Sysfs, dport: str) -> bool | None:
    """Whether a dport takes injected protocol errors (None: no EINJ to ask)."""
    if not fs.exists(EINJ_TYPES):
        return None
    return fs.exists(f"{DEBUGFS}/cxl/{dport}/einj_inject")


def _address(v: int | None) -> int | None:
    """The kernel prints an unset address as all ones (ULLONG_MAX)."""
    return None if v is None or v >= 2**64 - 1 else v


def _qos(v: int | None) -> int | None:
    return v if v is not None and v >= 0 else None


def _read_region(
    fs: Sysfs, name: str, decoder_port: dict[str, str], endpoint_memdev: dict[str, str]
) -> Region:
    dev = _dev(name)
    ways = fs.read_int(f"{dev}/interleave_ways") or 0
    if ways and ways not in VALID_WAYS:  # 0: not yet set, as a new region shows
        raise SysfsError(f"{dev}/interleave_ways", f"expected a count of ways such as 2, "
                         f"found {ways}")  # fmt: skip
    mappings = []
    for pos in range(ways):
        dec = fs.read(f"{dev}/target{pos}") or ""
        if dec:
            memdev = endpoint_memdev.get(decoder_port.get(dec, ""))
            mappings.append(Mapping(position=pos, decoder=dec, memdev=memdev))
    uuid = fs.read(f"{dev}/uuid") or None
    if uuid is not None and set(uuid.replace("-", "")) <= {"0"}:
        uuid = None
    text = fs.read(f"{dev}/mode")
    # Kernels before the 'mode' attribute show 'uuid' on pmem regions only.
    mode = next((m for m in PARTITION_MODES if m == text), None) or (
        PMEM if fs.exists(f"{dev}/uuid") else RAM
    )
    resource = _address(fs.read_int(f"{dev}/resource", root_only=True))
    return Region(
        name=name,
        type=mode,
        decoder=os.path.basename(os.path.dirname(fs.realpath(dev))),
        resource=resource,
        size=fs.read_int(f"{dev}/size") or 0,
        interleave_ways=ways,
        interleave_granularity=fs.read_int(f"{dev}/interleave_granularity") or 0,
        committed=bool(fs.read_bool(f"{dev}/commit")),
        enabled=fs.exists(f"{dev}/driver"),
        uuid=uuid,
        mappings=tuple(mappings),
        access=read_region_access(fs, dev),
        extended_linear_cache_size=fs.read_int(f"{dev}/extended_linear_cache_size"),
        locked=fs.read_bool(f"{dev}/locked"),
    )
