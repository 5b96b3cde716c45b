"""Build the CXL model through ndctl's libcxl (libcxl.so.1).

libcxl sees the same kernel objects as the sysfs backend; on the testbed both must give
the same model. What libcxl does not expose in every version is read from sysfs or left
None, as listed in ``SYSFS_ONLY_FIELDS``. Dax devices come from sysfs (libdaxctl is not
bound). One of two backends with one function, ``read_topology``; code above them calls
``pycxl.cxl.read.read_cxl``.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from ..base._lib.libs import LIBCXL
from ..base._lib.loader import cstr, has_symbol
from ..base.errors import OperationError
from ..base.sysfs import Sysfs
from ..base.values import PMEM, RAM
from .dax import read_dax_devices
from .model import Bus, Decoder, Dport, Mapping, Memdev, Port, Region
from .read import CXL_DEVICES
from .topology import CxlTopology

ULLONG_MAX = 2**64 - 1
UINT_MAX = 2**32 - 1
_MODES = {0: "none", 1: "mixed", 2: PMEM, 3: RAM}
_TARGET_TYPES = {1: "expander", 2: "accelerator"}

# Fields libcxl 76.x has no getter for; the libcxl backend leaves them at their default.
SYSFS_ONLY_FIELDS: dict[str, tuple[str, ...]] = {
    "Memdev": ("payload_max", "ram_qos_class", "pmem_qos_class", "poison_injectable"),
    "Decoder": ("type3_capable", "qos_class"),
    "Port": ("parent_dport", "decoders_committed"),
    "Region": ("access", "extended_linear_cache_size", "locked"),
    "Bus": ("injectable_protocol_errors",),
}


def read_topology(sysfs: Sysfs | None = None) -> CxlTopology:
    """Enumerate CXL through libcxl. Raises LibraryNotFoundError when libcxl is absent."""
    ffi, lib = LIBCXL.load()
    ctx_p = ffi.new("struct cxl_ctx **")
    rc = lib.cxl_new(ctx_p)
    if rc != 0:
        raise OperationError(f"libcxl: cxl_new failed ({rc})")
    ctx = ctx_p[0]
    try:
        return _Reader(ffi, lib, sysfs or Sysfs()).read(ctx)
    finally:
        lib.cxl_unref(ctx)


def _iterate(first: Any, next_fn: Any, ffi: Any) -> list[Any]:
    out = []
    obj = first
    while obj != ffi.NULL:
        out.append(obj)
        obj = next_fn(obj)
    return out


class _Reader:
    def __init__(self, ffi: Any, lib: Any, sysfs: Sysfs) -> None:
        self.ffi, self.lib, self.fs = ffi, lib, sysfs
        self.buses: list[Bus] = []
        self.ports: list[Port] = []
        self.endpoints: list[Port] = []
        self.decoders: list[Decoder] = []
        self.regions: dict[str, Region] = {}

    def s(self, ptr: Any) -> str:
        return cstr(self.ffi, ptr) or ""

    def read(self, ctx: Any) -> CxlTopology:
        ffi, lib = self.ffi, self.lib
        buses = _iterate(lib.cxl_bus_get_first(ctx), lib.cxl_bus_get_next, ffi)
        if not buses and not self.fs.is_dir(CXL_DEVICES):
            return CxlTopology(present=False, dax_devices=tuple(read_dax_devices(self.fs)))
        for bus in buses:
            root = lib.cxl_bus_get_port(bus)
            name = self.s(lib.cxl_bus_get_devname(bus))
            self.buses.append(
                Bus(name=name, provider=self.s(lib.cxl_bus_get_provider(bus)), port=name)
            )
            self._walk_port(root)
        memdevs = [
            self._memdev(m)
            for m in _iterate(lib.cxl_memdev_get_first(ctx), lib.cxl_memdev_get_next, ffi)
        ]
        return CxlTopology.build(
            buses=self.buses,
            ports=self.ports,
            endpoints=self.endpoints,
            decoders=self.decoders,
            memdevs=memdevs,
            regions=self.regions.values(),
            dax_devices=read_dax_devices(self.fs),
            source="libcxl",
        )

    def _walk_port(self, port: Any) -> None:
        ffi, lib = self.ffi, self.lib
        self._add_port(port)
        for ep in _iterate(lib.cxl_endpoint_get_first(port), lib.cxl_endpoint_get_next, ffi):
            self._add_port(lib.cxl_endpoint_get_port(ep))
        for child in _iterate(lib.cxl_port_get_first(port), lib.cxl_port_get_next, ffi):
            self._walk_port(child)

    def _add_port(self, port: Any) -> None:
        ffi, lib = self.ffi, self.lib
        name = self.s(lib.cxl_port_get_devname(port))
        kind = (
            "root"
            if lib.cxl_port_is_root(port)
            else "endpoint"
            if lib.cxl_port_is_endpoint(port)
            else "switch"
        )
        parent = lib.cxl_port_get_parent(port)
        dports = tuple(
            Dport(
                name=self.s(lib.cxl_dport_get_devname(d)),
                id=int(lib.cxl_dport_get_id(d)),
                alias=self._dport_alias(d),
            )
            for d in _iterate(lib.cxl_dport_get_first(port), lib.cxl_dport_get_next, ffi)
        )
        obj = Port(
            name=name,
            kind=kind,  # type: ignore[arg-type]
            host=self.s(lib.cxl_port_get_host(port)),
            depth=int(lib.cxl_port_get_depth(port)),
            parent=None
            if kind == "root" or parent == ffi.NULL
            else self.s(lib.cxl_port_get_devname(parent)),
            dports=tuple(sorted(dports, key=lambda d: d.id)),
            enabled=kind == "root" or bool(lib.cxl_port_is_enabled(port)),
        )
        (self.endpoints if kind == "endpoint" else self.ports).append(obj)
        for dec in _iterate(lib.cxl_decoder_get_first(port), lib.cxl_decoder_get_next, ffi):
            self.decoders.append(self._decoder(dec, kind, name))
            if kind == "root":
                for reg in _iterate(lib.cxl_region_get_first(dec), lib.cxl_region_get_next, ffi):
                    r = self._region(reg, self.decoders[-1].name)
                    self.regions[r.name] = r

    def _dport_alias(self, dport: Any) -> str | None:
        """The dport's firmware (ACPI) node, as ndctl prints it in 'alias'."""
        if not has_symbol(self.lib, "cxl_dport_get_firmware_node"):
            return None
        return cstr(self.ffi, self.lib.cxl_dport_get_firmware_node(dport))

    def _decoder(self, dec: Any, kind: str, port_name: str) -> Decoder:
        ffi, lib = self.ffi, self.lib
        size = int(lib.cxl_decoder_get_size(dec))
        resource = int(lib.cxl_decoder_get_resource(dec))
        targets = sorted(
            (int(lib.cxl_target_get_position(t)), int(lib.cxl_target_get_id(t)))
            for t in _iterate(lib.cxl_target_get_first(dec), lib.cxl_target_get_next, ffi)
        )
        region = lib.cxl_decoder_get_region(dec)
        granularity = int(lib.cxl_decoder_get_interleave_granularity(dec))
        endpoint = kind == "endpoint"
        root = kind == "root"
        dpa_resource = int(lib.cxl_decoder_get_dpa_resource(dec)) if endpoint else None
        dpa_size = int(lib.cxl_decoder_get_dpa_size(dec)) if endpoint else None
        return Decoder(
            name=self.s(lib.cxl_decoder_get_devname(dec)),
            kind=kind,  # type: ignore[arg-type]
            port=port_name,
            resource=None if resource == ULLONG_MAX else resource,
            size=0 if size == ULLONG_MAX else size,
            interleave_ways=int(lib.cxl_decoder_get_interleave_ways(dec)),
            interleave_granularity=None if granularity == UINT_MAX else granularity,
            locked=bool(lib.cxl_decoder_is_locked(dec)),
            target_type=_TARGET_TYPES.get(int(lib.cxl_decoder_get_target_type(dec)))
            if kind != "root"
            else None,
            target_list=tuple(i for _, i in targets),
            # The kernel publishes capabilities on root decoders only (cap_*); libcxl
            # reports lower-level decoders as capable of everything.
            pmem_capable=root and bool(lib.cxl_decoder_is_pmem_capable(dec)),
            volatile_capable=root and bool(lib.cxl_decoder_is_volatile_capable(dec)),
            accelmem_capable=root and bool(lib.cxl_decoder_is_accelmem_capable(dec)),
            mode=_MODES.get(int(lib.cxl_decoder_get_mode(dec)), "none") if endpoint else None,
            dpa_resource=None if dpa_resource == ULLONG_MAX else dpa_resource,
            dpa_size=None if dpa_size == ULLONG_MAX else dpa_size,
            region=None if region == ffi.NULL else self.s(lib.cxl_region_get_devname(region)),
        )

    def _region(self, reg: Any, root_decoder: str) -> Region:
        ffi, lib = self.ffi, self.lib
        mappings = []
        modes = set()
        for m in _iterate(lib.cxl_mapping_get_first(reg), lib.cxl_mapping_get_next, ffi):
            dec = lib.cxl_mapping_get_decoder(m)
            memdev = lib.cxl_decoder_get_memdev(dec)
            modes.add(_MODES.get(int(lib.cxl_decoder_get_mode(dec)), "none"))
            mappings.append(
                Mapping(
                    position=int(lib.cxl_mapping_get_position(m)),
                    decoder=self.s(lib.cxl_decoder_get_devname(dec)),
                    memdev=None
                    if memdev == ffi.NULL
                    else self.s(lib.cxl_memdev_get_devname(memdev)),
                )
            )
        # libcxl 76.x has no region mode: the region's type is its endpoint decoders'
        mode = (_MODES.get(int(lib.cxl_region_get_mode(reg)))
                if has_symbol(lib, "cxl_region_get_mode") else None)  # fmt: skip
        rtype = RAM if mode == RAM else PMEM if mode == PMEM or PMEM in modes else RAM
        uu = ffi.new("unsigned char[16]")
        lib.cxl_region_get_uuid(reg, uu)
        raw = bytes(ffi.buffer(uu, 16))
        resource = int(lib.cxl_region_get_resource(reg))
        return Region(
            name=self.s(lib.cxl_region_get_devname(reg)),
            type=rtype,
            decoder=root_decoder,
            resource=None if resource == ULLONG_MAX else resource,
            size=int(lib.cxl_region_get_size(reg)),
            interleave_ways=int(lib.cxl_region_get_interleave_ways(reg)),
            interleave_granularity=int(lib.cxl_region_get_interleave_granularity(reg)),
            committed=bool(lib.cxl_region_decode_is_committed(reg)),
            enabled=bool(lib.cxl_region_is_enabled(reg)),
            uuid=None if raw == bytes(16) else str(uuidlib.UUID(bytes=raw)),
            mappings=tuple(sorted(mappings, key=lambda m: m.position)),
        )

    def _memdev(self, m: Any) -> Memdev:
        ffi, lib = self.ffi, self.lib
        serial = int(lib.cxl_memdev_get_serial(m))
        numa = int(lib.cxl_memdev_get_numa_node(m))
        fw_getter = next(
            (
                n
                for n in ("cxl_memdev_get_firmware_version", "cxl_memdev_get_firmware_verison")
                if has_symbol(lib, n)
            ),
            None,
        )
        return Memdev(
            name=self.s(lib.cxl_memdev_get_devname(m)),
            serial=None if serial == ULLONG_MAX else serial,
            host=self.s(lib.cxl_memdev_get_host(m)),
            ram_size=int(lib.cxl_memdev_get_ram_size(m)),
            pmem_size=int(lib.cxl_memdev_get_pmem_size(m)),
            numa_node=numa if numa >= 0 else None,
            firmware_version=cstr(ffi, getattr(lib, fw_getter)(m)) if fw_getter else None,
            label_storage_size=int(lib.cxl_memdev_get_label_size(m)),
            enabled=bool(lib.cxl_memdev_is_enabled(m)),
        )
