"""The sysfs backend on trees recorded from the testbed's real kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from pycxl.base.errors import NotFoundError
from pycxl.base.sysfs import Sysfs
from pycxl.cxl.sysfs_backend import read_topology


def topo(trees: Path, name: str):  # type: ignore[no-untyped-def]
    return read_topology(Sysfs(trees / name))


def test_two_dev_fresh_objects(trees: Path) -> None:
    t = topo(trees, "two-dev/fresh")
    assert t.present
    assert sorted(m.serial for m in t.memdevs if m.serial is not None) == [1, 2]
    assert [b.provider for b in t.buses] == ["ACPI.CXL"]
    (root,) = t.root_decoders()
    assert root.volatile_capable and root.pmem_capable
    assert root.size == 4 << 30 and root.target_list == (12,)
    assert [d.name for d in root.targets] == ["pci0000:0c"]
    assert root.max_available_extent == 4 << 30
    assert t.regions == () and t.dax_devices == ()
    for m in t.memdevs:
        assert m.ram_size == 256 << 20 and m.pmem_size == 0
        assert m.endpoint is not None and m.endpoint.memdev == m
        assert m.endpoint.parent_port is not None and m.endpoint.parent_port.kind == "switch"
        assert all(d.kind == "endpoint" and d.mode in ("none", "ram") for d in m.decoders)


def test_two_dev_region_navigation_both_ways(trees: Path) -> None:
    t = topo(trees, "two-dev/region")
    (r,) = t.regions
    # the default granularity is the root decoder's (256 for this 1-way window)
    assert (r.type, r.size, r.interleave_ways, r.interleave_granularity) == (
        "ram",
        512 << 20,
        2,
        256,
    )
    assert r.committed and r.enabled and r.decode_state == "commit"
    assert [m.position for m in r.mappings] == [0, 1]
    assert sorted(r.memdevs) == ["mem0", "mem1"]
    for name in r.memdevs:
        assert [x.name for x in t.memdev(name).regions] == [r.name]
    root = t.decoder(r.decoder)
    assert root.kind == "root" and root.regions == [r]
    assert root.max_available_extent == (4 << 30) - (512 << 20)
    (dax,) = r.dax_devices
    assert (dax.mode, dax.target_node, dax.online_memblocks, dax.total_memblocks) == (
        "system-ram",
        1,
        4,
        4,
    )
    # recorded after pycxl region create with its default zone (normal)
    assert dax.movable is False and dax.zone == "normal" and r.numa_nodes == [1]
    assert t.node_to_region() == {1: "region0"}
    ep_dec = t.decoder(r.mappings[0].decoder)
    assert ep_dec.region == r.name and ep_dec.mode == "ram" and ep_dec.dpa_size == 256 << 20


def test_four_dev_root_windows(trees: Path) -> None:
    t = topo(trees, "four-dev/fresh")
    roots = {d.name: d for d in t.root_decoders()}
    assert roots["decoder0.0"].target_list == (12, 222)
    assert roots["decoder0.0"].interleave_ways == 2
    assert roots["decoder0.1"].target_list == (12,)
    assert sorted(m.serial for m in t.memdevs if m.serial) == [0x11, 0x12, 0x21, 0x22]
    bridges = {p.host: p for p in t.ports if p.kind == "switch"}
    assert sorted(bridges) == ["pci0000:0c", "pci0000:de"]
    for m in t.memdevs:
        ep = m.endpoint
        assert ep is not None and ep.parent_port is not None
        # serials 0x1x sit under bus 12 (pci0000:0c), 0x2x under bus 222 (pci0000:de)
        want = "pci0000:0c" if m.serial is not None and m.serial < 0x20 else "pci0000:de"
        assert ep.parent_port.host == want


def test_find_memdev_by_name_serial_host(trees: Path) -> None:
    t = topo(trees, "two-dev/fresh")
    m = t.find_memdev("0x2")
    assert t.find_memdev(m.name) == m == t.find_memdev(m.host) == t.find_memdev("2")
    with pytest.raises(NotFoundError, match=r"unknown memdev 'mem9'; known: mem0, mem1"):
        t.find_memdev("mem9")


def test_no_cxl_bus(tmp_path: Path) -> None:
    (tmp_path / "sys" / "devices").mkdir(parents=True)  # a sysfs tree without /sys/bus/cxl
    t = read_topology(Sysfs(tmp_path))
    assert not t.present and t.memdevs == ()
