"""Long-term pins on the real kernel, without a GPU: io_uring fixed buffers take the same
FOLL_LONGTERM pin that GPU registration takes. By page location: a CXL node onlined
movable loses its pinned pages to DRAM (the kernel's rule) and pycxl's placement check
fires; the normal zone keeps them; a device-dax mapping keeps them; zones and modes can
be changed on a live region as one plan, and a refused change leaves it as it was.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError, PlacementError
from pycxl.cxl.region_layout import RegionRequest
from pycxl.numa.longterm import LongtermPin, check_pinned, pin_placement
from pycxl.resolve.system import snapshot
from tests.kernel.kernel_helpers import cxl_state, pycxl_cli, state_diff

MiB = 1 << 20
PAGES = 2 * MiB // 4096


def _probe(target: str) -> dict[str, object]:
    p = pycxl_cli("pin-probe", target, "--json")
    assert p.returncode == 0, p.stderr
    (doc,) = json.loads(p.stdout)
    assert isinstance(doc, dict)
    return doc


@pytest.mark.kernel(topology="two-dev")
def test_movable_loses_pinned_pages_normal_keeps_them() -> None:
    made = pycxl.create_region(RegionRequest(ways=2, zone="movable"))
    cxl, dram = made.numa_node, snapshot(gpus=False).resolve("dram0").node
    assert made.zone == "movable" and cxl is not None and dram is not None

    # the kernel's behaviour: every pinned page leaves the movable node, silently
    doc = _probe("cxl0")
    assert doc["zone"] == "movable" and doc["longterm_pin"] is False
    assert doc["pages"] == PAGES and doc["pages_on_node"] == 0
    assert doc["moved_to"] == {str(dram): PAGES}
    # pycxl's placement check turns that into an error naming the fix
    buf = pycxl.allocate("2M", "cxl0")
    pins: list[LongtermPin] = []
    placed = pin_placement(buf, lambda: pins.append(LongtermPin(buf)))
    with pytest.raises(PlacementError, match=r"512 of 512 pages .* --zone normal"):
        check_pinned(placed, "the test buffer")
    pins[0].close()
    buf.close()
    nodes = json.loads(pycxl_cli("list", "-N", "--json").stdout)
    assert {(n["name"], n["zone"], n["longterm_pin"]) for n in nodes} >= {
        ("cxl0", "movable", False)
    }

    # moved into the normal zone on the live region, as one plan: pins stay
    p = pycxl_cli("region", "enable", made.name, "--zone", "normal", "--dry-run")
    assert p.returncode == 0 and "offline" in p.stdout and "online_kernel" in p.stdout, p.stdout
    p = pycxl_cli("region", "enable", made.name, "--zone", "normal", "--json")
    assert p.returncode == 0, p.stderr
    (res,) = json.loads(p.stdout)  # enable prints a list, one object per region
    assert res["zone"] == "normal" and res["longterm_pin"] is True and res["tier"] == "cxl0"
    doc = _probe("cxl0")
    assert doc["longterm_pin"] is True and doc["pages_on_node"] == PAGES and doc["moved_to"] == {}
    pycxl.destroy_region(made.name)


@pytest.mark.kernel(topology="two-dev")
def test_a_zone_change_refused_by_pinned_pages_changes_nothing() -> None:
    made = pycxl.create_region(RegionRequest(ways=2))  # the default: normal
    assert made.zone == "normal"
    buf = pycxl.allocate("2M", "cxl0")
    pin = LongtermPin(buf)
    before = cxl_state()
    p = pycxl_cli("region", "enable", made.name, "--zone", "movable")
    assert p.returncode == 1 and "cannot be offlined" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert state_diff(before, cxl_state()) == []
    assert snapshot(gpus=False).cxl.region(made.name).dax_devices[0].zone == "normal"
    pin.close()
    buf.close()
    pycxl.destroy_region(made.name)


@pytest.mark.kernel(topology="two-dev")
def test_device_dax_mapping_keeps_pinned_pages_and_modes_switch() -> None:
    made = pycxl.create_region(RegionRequest(ways=2, mode="devdax"))
    (dax,) = snapshot(gpus=False).cxl.region(made.name).dax_devices
    assert dax.mode == "devdax" and made.numa_node is None and dax.align
    with pytest.raises(InvalidRequestError, match=r"not a multiple of dax\d+\.\d+'s alignment"):
        pycxl.map_dax(made.name, 4096)
    with pycxl.map_dax(made.name, dax.align) as m:
        a = m.array("uint64")
        a[:] = np.arange(a.size, dtype=np.uint64)
        pins: list[LongtermPin] = []
        placed = pin_placement(m, lambda: pins.append(LongtermPin(m)))
        assert check_pinned(placed, "the dax mapping").stayed
        assert int(a[-1]) == a.size - 1
        pins[0].close()
        del a

    # devdax -> system-ram (a NUMA node, normal zone) -> devdax, each as one plan
    p = pycxl_cli("region", "enable", made.name, "--mode", "system-ram", "--json")
    assert p.returncode == 0, p.stderr
    (res,) = json.loads(p.stdout)
    assert res["tier"] == "cxl0" and res["zone"] == "normal"
    assert res["dax"] == [{"chardev": dax.name, "mode": "system-ram"}]
    with pytest.raises(InvalidRequestError, match="in system-ram mode"):
        pycxl.map_dax(dax.name)
    p = pycxl_cli("region", "enable", made.name, "--mode", "devdax", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)[0]["dax"] == [{"chardev": dax.name, "mode": "devdax"}]
    assert "cxl0" not in {t.name for t in snapshot(gpus=False).nodes}
    pycxl.destroy_region(made.name)
