"""Enumeration on the real kernel: both backends agree, JSON agrees with ndctl."""

from __future__ import annotations

import json
import os

import pytest

from pycxl.byname.listing import ListRequest, list_json
from pycxl.cxl import libcxl_backend, sysfs_backend
from pycxl.resolve.system import snapshot
from pycxl.testbed import TOPOLOGIES
from tests.kernel.kernel_helpers import backend_differences, ndctl, pycxl_cli
from tests.ndctl_compare import compare, flatten

ALL_KINDS = ("bus", "port", "endpoint", "memdev", "decoder", "region")
EVERYTHING = ListRequest.showing(
    "buses", "ports", "endpoints", "memdevs", "decoders", "regions",
    targets=True, include_disabled=True,
)  # fmt: skip


def _check_backends_and_ndctl(topology: str) -> None:
    by_sysfs = sysfs_backend.read_topology()
    by_libcxl = libcxl_backend.read_topology()
    assert len(by_sysfs.memdevs) == len(TOPOLOGIES[topology].serials)
    diffs = backend_differences(by_sysfs, by_libcxl)
    assert not diffs, "\n".join(diffs)
    oracle = ndctl("-BPEMDRT", "-i", "-vvv")
    n, diffs = compare(list_json(snapshot(gpus=False), EVERYTHING), oracle, ALL_KINDS)
    assert diffs == []
    assert n == sum(1 for k in flatten(oracle) if k[0] in ALL_KINDS) > 0


@pytest.mark.kernel(topology=("two-dev", "four-dev", "two-socket", "pmem-dev"))
def test_backends_agree_and_match_ndctl() -> None:
    _check_backends_and_ndctl(os.environ["PYCXL_TESTBED_TOPOLOGY"])


@pytest.mark.kernel(topology="four-dev")
def test_four_dev_devices_found_by_serial_under_their_bridge() -> None:
    topo = sysfs_backend.read_topology()
    root = next(d for d in topo.root_decoders() if d.interleave_ways == 2)
    bridges = [t.name for t in root.targets]
    assert len(bridges) == 2
    for serial in TOPOLOGIES["four-dev"].serials:
        m = topo.find_memdev(hex(serial))
        ep = m.endpoint
        assert ep is not None and ep.parent_port is not None
        # QEMU puts serials 0x1x behind the first bridge (bus 12), 0x2x behind the second
        assert ep.parent_port.host == bridges[0 if serial < 0x20 else 1]


FILTERS = [
    ["-d", "root"], ["-d", "endpoint", "-i"], ["-d", "decoder0.0"], ["-m", "mem0"], ["-s", "0x1"],
    ["-b", "root0"], ["-e", "endpoint2"], ["-p", "port1"], ["-D", "-m", "mem1"],
    ["-M", "-d", "root"],
]  # fmt: skip


@pytest.mark.kernel(topology="two-dev")
def test_filters_list_what_cxl_list_lists() -> None:
    """A filter alone lists its own kind, as cxl list does; the same objects either way."""
    for args in FILTERS:
        ours = json.loads(pycxl_cli("list", *args, "--json").stdout)
        theirs = ndctl(*args)
        assert set(flatten(ours)) == set(flatten(theirs)) != set(), args


@pytest.mark.kernel(topology="two-dev")
def test_cli_list_on_the_real_kernel() -> None:
    p = pycxl_cli("list")
    assert p.returncode == 0, p.stderr
    assert "mem0" in p.stdout and "mem1" in p.stdout and "dram0" in p.stdout
    doc = json.loads(pycxl_cli("list", "-M", "--json").stdout)
    assert sorted(m["serial"] for m in doc) == [1, 2]
    p = pycxl_cli("list", "-m", "mem9")
    assert p.returncode == 5 and "known: mem0, mem1" in p.stderr
