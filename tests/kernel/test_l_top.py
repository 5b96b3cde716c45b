"""pycxl top on the real kernel with CXL memory (testbed): a bandwidth run on the CXL
node shows in that node's page traffic and in the process view, the figures the
emulated devices cannot count (QEMU's type-3 devices have no CPMU) say why, a command
run under top is followed on its tier; and pycxl list shows each memdev's link and CXL
capability as lspci -vv shows them in the same boot."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

import pycxl
from pycxl.counters.base import ALLOC, MEM_READ, MEM_WRITE, REMOTE
from pycxl.cxl.region_layout import RegionRequest
from tests.top_runs import bandwidth_under_top

SIZE = "256K"  # CXL memory is very slow under emulation


def _pycxl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycxl.cli.main", *args], capture_output=True,
                          text=True, check=False, timeout=600)  # fmt: skip


@pytest.mark.kernel(topology="two-dev")
def test_a_bandwidth_run_on_the_cxl_node_shows_in_its_row_and_the_process_view() -> None:
    made = pycxl.create_region(RegionRequest(ways=2, zone="movable"))
    assert made.tier == "cxl0"
    reports, result = bandwidth_under_top("cxl0", SIZE, 0.5)
    pages = result["pages_on_node"]
    rows = [next(n for n in r.nodes if n.name == "cxl0") for r in reports]
    # nothing else allocates on the CXL node: its allocations are the bench's arrays, each
    # for a process on another node (the node has no CPU)
    allocated = sum((n.value(ALLOC) or 0.0) * r.interval_s for n, r in zip(rows, reports,
                                                                          strict=True))  # fmt: skip
    remote = sum((n.value(REMOTE) or 0.0) * r.interval_s for n, r in zip(rows, reports,
                                                                        strict=True))  # fmt: skip
    assert round(allocated) >= pages and remote == pytest.approx(allocated), (allocated, remote,
                                                                              pages)  # fmt: skip
    resident = max(sum(n.resident for n in r.process.nodes if n.name == "cxl0")
                   for r in reports if r.process is not None)  # fmt: skip
    assert resident >= pages * 4096, (resident, pages)
    # no CPMU in the emulated devices: the figures are missing, with the memdevs named
    for figure in (MEM_READ, MEM_WRITE):
        why = rows[-1].missing[figure]
        assert why.short == "no-CPMU" and "cxl_pmu" in why.reason, why
        assert all(m in why.reason for m in ("mem0", "mem1")), why
        assert rows[-1].value(figure) is None
    # the ceiling: both memdevs' Gen5 x16 links
    ceiling = rows[-1].ceilings["memory"]
    assert ceiling.bytes_per_s == pytest.approx(2 * 63.015e9, rel=1e-3), ceiling
    pycxl.destroy_region(made.name)


@pytest.mark.kernel(topology="two-dev")
def test_a_command_run_under_top_is_followed_on_its_tier() -> None:
    """top -- pycxl run --membind cxl0 -- sh ...: the command (the same process once
    pycxl run execs it) holds a 1 MiB string on cxl0 while top watches, and top exits
    with its status. A shell, not Python: the emulator is fragile where a guest's
    programs run from CXL memory (docs/testbed.md), so the command is small, and run
    once without the policy first to keep its program's pages off the CXL node. The
    region is onlined movable: the kernel's own allocations for a process bound to the
    node (page tables, slabs) then go elsewhere, and the region can be taken offline
    after it."""
    pycxl.create_region(RegionRequest(ways=2, zone="movable"))
    script = 'x=$(head -c 1048576 /dev/zero | tr "\\0" a); sleep 2; exit 5'
    assert subprocess.run(["sh", "-c", script], check=False).returncode == 5  # warm
    p = _pycxl("top", "-d", "0.5", "--json", "--", sys.executable, "-m", "pycxl.cli.main", "run",
               "--membind", "cxl0", "--", "sh", "-c", script)  # fmt: skip
    assert p.returncode == 5, p.stderr
    reports = [json.loads(line) for line in p.stdout.splitlines()]
    on_cxl = [n["resident_bytes"] for r in reports for n in r["process"]["nodes"]
              if n["name"] == "cxl0"]  # fmt: skip
    assert on_cxl and max(on_cxl) >= 1 << 20, reports
    assert reports[-1]["process"]["exited"]


@pytest.mark.kernel(topology="two-dev")
def test_list_shows_each_memdevs_link_and_cxl_capability_as_lspci_does() -> None:
    lspci = shutil.which("lspci")
    assert lspci is not None, "lspci (pciutils) is not installed: scripts/setup-test-env.sh"
    p = _pycxl("list", "-M", "--json")
    assert p.returncode == 0, p.stderr
    memdevs = json.loads(p.stdout)
    assert len(memdevs) == 2
    for m in memdevs:
        text = subprocess.run([lspci, "-vv", "-s", m["host"]], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
        sta = re.search(r"LnkSta:\s+Speed ([0-9.]+)GT/s( \(downgraded\))?, Width x(\d+)", text)
        cap = re.search(r"LnkCap:\s+Port #\d+, Speed ([0-9.]+)GT/s, Width x(\d+)", text)
        cxl = re.search(r"CXLCap:\t(.+)", text)
        assert sta and cap and cxl, text
        link = m["pcie_link"]
        assert (link["speed_gts"], link["width"]) == (float(sta.group(1)), int(sta.group(3)))
        assert (link["cap_speed_gts"], link["cap_width"]) == (float(cap.group(1)),
                                                              int(cap.group(2)))  # fmt: skip
        assert link["downgraded"] == bool(sta.group(2))
        assert m["cxl_capability"]["lspci"] == cxl.group(1), (m["cxl_capability"], text)
    table = _pycxl("list", "-M").stdout
    assert all(m["cxl_capability"]["lspci"] in table for m in memdevs), table
