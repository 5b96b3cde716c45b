"""pycxl top on this machine and on recorded trees: the perf machinery counts a real
counter at the kernel's rate, PMU descriptions parse from a recorded tree (and a broken
copy is refused naming its file), the node rows and the process view rise with a
``bench bandwidth`` run, every figure this host lacks says why, PCIe links carry what
their speed and width give, the CXL DVSEC reads as lspci read it, and the command's
output, JSON and exit statuses."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pycxl
from pycxl.base.errors import SysfsError
from pycxl.base.sysfs import Sysfs
from pycxl.counters import pmus
from pycxl.counters.base import ALLOC, LOCAL, MEM_READ, MEM_WRITE, PCIE_RX, Reading, per_second
from pycxl.counters.perf_event import PerfRefused, open_counter, read_count
from pycxl.ops.top import top_row_json
from pycxl.pci.caps import parse_cxl_capability
from pycxl.pci.link import bandwidth
from tests.top_runs import bandwidth_under_top

ROOT = Path(__file__).resolve().parents[2]
PMU_TREE = ROOT / "tests" / "data" / "pmu" / "vm"
PCI = ROOT / "tests" / "data" / "pci" / "two-dev"


def _pycxl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycxl.cli.main", *args], capture_output=True,
                          text=True, check=False, timeout=timeout)  # fmt: skip


# --- the counters' machinery ----------------------------------------------------------------
def _tsc_mhz() -> float | None:
    """The TSC frequency the kernel found at boot, from its log."""
    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    found = re.findall(r"tsc: (?:Refined TSC clocksource calibration:|Detected) ([0-9.]+) MHz", log)
    return float(found[-1]) if found else None


def test_perf_event_open_counts_the_tsc_at_the_rate_the_kernel_calibrated() -> None:
    """The msr PMU's tsc event, opened system-wide on CPU 0 as the memory-controller
    counters are, read twice: its rate is the TSC frequency the kernel found."""
    fs = Sysfs()
    event = pmus.read_event(fs, "msr", "tsc")
    mhz = _tsc_mhz()
    if event is None or mhz is None:
        pytest.skip("this machine has no msr PMU with a tsc event, or no TSC in the kernel log")
    try:
        fd = open_counter(event.type, event.config[0], 0)
    except PerfRefused as e:
        pytest.skip(f"the kernel refuses system-wide counters here: {e}")
    try:
        a, t0 = read_count(fd), time.monotonic()
        time.sleep(0.3)
        b, t1 = read_count(fd), time.monotonic()
    finally:
        os.close(fd)
    assert b.enabled_ns > a.enabled_ns and b.running_ns == b.enabled_ns  # not multiplexed
    rate = (b.scaled - a.scaled) / (t1 - t0)
    assert rate == pytest.approx(mhz * 1e6, rel=0.03), (rate, mhz)


def _renamed_msr_pmus(tmp: Path, names: dict[str, dict[str, str]]) -> Sysfs:
    """A tree whose PMUs are copies of this machine's msr PMU (its type, its format)
    under other names, each with the events given (name -> terms or a .scale/.unit) and
    CPU 0 as its cpumask: counters opened through them count the TSC."""
    live = Path("/sys/bus/event_source/devices/msr")
    for name, events in names.items():
        pmu = tmp / "sys/bus/event_source/devices" / name
        (pmu / "events").mkdir(parents=True)
        shutil.copytree(live / "format", pmu / "format")
        (pmu / "type").write_text((live / "type").read_text())
        (pmu / "cpumask").write_text("0\n")
        for event, text in events.items():
            (pmu / "events" / event).write_text(text + "\n")
    return Sysfs(tmp)


def test_memory_counters_are_found_scaled_to_bytes_and_put_on_their_nodes(tmp_path: Path) -> None:
    """How the memory-controller and CXL device counters are chosen, scaled and given to
    nodes, on this machine's msr PMU renamed as an uncore controller and as two memdevs'
    CPMUs (no machine here has either): each then counts the TSC, so a controller's
    'bytes' grow at the TSC's rate times its event's scale and unit, a CXL node's at 64
    bytes a count, summed over its memdevs (and over both write events)."""
    from pycxl.counters.memory_pmus import open_reader

    mhz = _tsc_mhz()
    if mhz is None or pmus.read_event(Sysfs(), "msr", "tsc") is None or os.geteuid() != 0:
        pytest.skip("needs root, an msr PMU and the TSC's rate in the kernel log")
    imc = {
        "cas_count_read": "event=0x00",
        "cas_count_read.scale": "6.103515625e-5",
        "cas_count_read.unit": "MiB",
        "cas_count_write": "event=0x00",
        "cas_count_write.scale": "6.103515625e-5",
        "cas_count_write.unit": "MiB",
    }
    cpmu = {"s2m_drs_memdata": "event=0x00", "m2s_rwd_memwr": "event=0x00",
            "m2s_rwd_memwrptl": "event=0x00"}  # fmt: skip
    fs = _renamed_msr_pmus(tmp_path, {"uncore_imc_0": imc, "cxl_pmu_mem0.0": cpmu,
                                      "cxl_pmu_mem1.0": cpmu})  # fmt: skip
    reader = open_reader(fs, {0: 0}, [0], {1: ["mem0", "mem1"], 2: ["mem0", "mem2"]})
    try:
        a = reader.read()
        time.sleep(0.3)
        b = reader.read()
    finally:
        reader.close()
    rate = per_second(b, a)
    tsc = mhz * 1e6
    assert rate[(("node", 0), MEM_READ)] == pytest.approx(tsc * 64, rel=0.03)
    assert rate[(("node", 0), MEM_WRITE)] == pytest.approx(tsc * 64, rel=0.03)
    assert rate[(("node", 1), MEM_READ)] == pytest.approx(2 * tsc * 64, rel=0.03)
    assert rate[(("node", 1), MEM_WRITE)] == pytest.approx(2 * 2 * tsc * 64, rel=0.03)
    # a node one of whose memdevs has no CPMU gets no partial figure, but the reason
    why = b.missing[(("node", 2), MEM_READ)]
    assert why.short == "no-CPMU" and "mem2" in why.reason and (("node", 2), MEM_READ) not in rate
    assert "uncore_imc" in b.methods[("node", 0)] and "mem0, mem1" in b.methods[("node", 1)]


def test_pmu_events_parse_from_a_recorded_tree() -> None:
    fs = Sysfs(PMU_TREE)
    assert {"msr", "uprobe", "software"} <= set(pmus.pmus(fs))
    tsc = pmus.read_event(fs, "msr", "tsc")
    assert tsc is not None and tsc.type == 9 and tsc.config == (0, 0, 0)
    assert tsc.scale == 1.0 and tsc.unit is None and tsc.bytes_per_count is None
    assert pmus.read_event(fs, "msr", "cas_count_read") is None  # no such event: None
    # the uprobe PMU's two formats, as the kernel wrote them
    uprobe = PMU_TREE / "sys/bus/event_source/devices/uprobe/format"
    formats = {
        f: pmus.parse_format((uprobe / f).read_text()) for f in ("ref_ctr_offset", "retprobe")
    }
    assert formats == {"ref_ctr_offset": ("config", ((32, 63),)), "retprobe": ("config", ((0, 0),))}
    assert pmus.encode("retprobe,ref_ctr_offset=0x10", formats) == ((0x10 << 32) | 1, 0, 0)


def test_event_terms_spread_over_their_formats_bits() -> None:
    """As perf does: a term's value fills its format's spans low bits first; an event
    whose value is wider than its bits, or names a term without a format, is refused."""
    formats = {"event": ("config", ((0, 7), (32, 35))), "umask": ("config", ((8, 15),)),
               "hdm": ("config2", ((0, 15),))}  # fmt: skip
    assert pmus.encode("event=0x1ff,umask=0x3,hdm=7", formats) == (
        0xFF | (0x1 << 32) | (0x3 << 8), 0, 7)  # fmt: skip
    assert pmus.encode("config=0x1e98000000000001", {}) == (0x1E98000000000001, 0, 0)
    with pytest.raises(ValueError, match="wider"):
        pmus.encode("umask=0x100", formats)
    with pytest.raises(ValueError, match="no format"):
        pmus.encode("thresh=1", formats)


def test_a_broken_pmu_description_is_refused_naming_its_file(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(PMU_TREE, tree)
    fmt = tree / "sys/bus/event_source/devices/msr/format/event"
    fmt.write_text("config:zero-63\n")
    with pytest.raises(SysfsError, match="msr/format/event"):
        pmus.read_event(Sysfs(tree), "msr", "tsc")
    fmt.write_text("config:0-63\n")
    (tree / "sys/bus/event_source/devices/msr/events/tsc.scale").write_text("lots\n")
    with pytest.raises(SysfsError, match=r"tsc\.scale"):
        pmus.read_event(Sysfs(tree), "msr", "tsc")


def test_rates_use_each_counters_own_timestamps_and_pass_sampled_rates() -> None:
    gpu = ("gpu", 0)
    before = Reading("nvml", 10.0, totals={(gpu, PCIE_RX): 1000.0}, stamps={(gpu, PCIE_RX): 5.0})
    now = Reading("nvml", 11.0, totals={(gpu, PCIE_RX): 3000.0}, stamps={(gpu, PCIE_RX): 5.5},
                  rates={(gpu, "hbm_busy"): 0.25})  # fmt: skip
    assert per_second(now, before) == {(gpu, PCIE_RX): 4000.0, (gpu, "hbm_busy"): 0.25}


def test_nvml_counters_that_wrap_are_unwrapped_at_their_width() -> None:
    from pycxl.gpu.link_counters import _Gpu, _unwrap

    g = _Gpu(0, None, "counters")
    assert _unwrap(g, 198, (1 << 32) - 100, 32) == (1 << 32) - 100
    assert _unwrap(g, 198, 50, 32) == (1 << 32) + 50  # wrapped once: 150 bytes moved
    assert _unwrap(g, 198, 60, 32) == (1 << 32) + 60


def test_narrow_counters_read_too_far_apart_give_no_figure_for_that_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """32-bit counters are unwrapped from reads 10 ms apart; two reads further apart than
    the fastest link could wrap one (35 ms) may have missed a wrap: that interval says so.
    (NVML's answers here are the ones an H200 gives: value, width, timestamp in us.)"""
    from pycxl.gpu import link_counters as lc

    answers = iter([
        [(100, 32, 1_000), (5, 32, 1_000)],
        [(200, 32, 11_000), (6, 32, 11_000)],
        [(50, 32, 100_000), (7, 32, 100_000)],  # 89 ms later: a wrap could hide
        [(60, 32, 110_000), (8, 32, 110_000)],
        [(70, 32, 120_000), (9, 32, 120_000)],
    ])  # fmt: skip
    monkeypatch.setattr(lc, "_fields", lambda *args: next(answers))
    links = lc.GpuLinks(None, None, [], {})
    g = lc._Gpu(0, None, "polled", pcie_bits=32)
    gpu = ("gpu", 0)
    seen = []
    for _ in range(5):
        totals: dict = {}
        missing: dict = {}
        links._read_fields(g, gpu, totals, {}, missing)
        seen.append((totals.get((gpu, PCIE_RX)), missing.get((gpu, PCIE_RX))))
    assert [t for t, _ in seen] == [100, 200, None, (1 << 32) + 60, (1 << 32) + 70]
    # the lapsed reading and the next (its interval starts without a total) say why
    assert [m.short if m else None for _, m in seen] == [None, None, "lapsed", "lapsed", None]
    assert "89 ms apart" in seen[2][1].reason and "35 ms" in seen[2][1].reason
    # on a Gen5 x16 link (63 GB/s at most) the counter takes 68 ms to wrap: reads 37 ms
    # apart (as a busy GPU host kept them) miss nothing
    answers = iter([[(0, 32, 0), (0, 32, 0)], [(9, 32, 37_000), (9, 32, 37_000)]])
    gen5 = lc._Gpu(0, None, "polled", pcie_bits=32, link_bytes_per_s=63.015e9)
    for _ in range(2):
        links._read_fields(gen5, gpu, {}, {}, missing := {})
        assert not missing, missing


# --- links --------------------------------------------------------------------------------
def test_pcie_links_carry_what_their_speed_width_and_encoding_give() -> None:
    assert bandwidth(32.0, 16) == pytest.approx(63.015e9, rel=1e-4)  # Gen5 x16, 128b/130b
    assert bandwidth(16.0, 8) == pytest.approx(15.754e9, rel=1e-4)
    assert bandwidth(2.5, 1) == pytest.approx(0.25e9)  # Gen1: 8b/10b
    assert bandwidth(64.0, 16) == pytest.approx(121.0e9, rel=1e-3)  # Gen6 FLIT: 242/256
    assert bandwidth(None, 16) is None and bandwidth(32.0, None) is None


def test_the_cxl_dvsec_reads_as_lspci_read_it_in_the_same_boot() -> None:
    lspci = (PCI / "lspci-vv-0d:00.0.txt").read_text()
    cap_line = re.search(r"CXLCap:\t(.+)", lspci)
    dvsec = re.search(r"Vendor=1e98 ID=0000 Rev=(\d+)", lspci)
    assert cap_line and dvsec
    cap = parse_cxl_capability((PCI / "0000:0d:00.0" / "config").read_bytes())
    assert cap is not None and cap.lspci_text() == cap_line.group(1)
    assert cap.revision == int(dvsec.group(1)) and cap.mem and cap.mem_enabled and not cap.cache
    ctl = re.search(r"CXLCtl:\tCache(.) IO(.) Mem(.)", lspci)
    assert ctl and (cap.cache_enabled, cap.io_enabled, cap.mem_enabled) == tuple(
        f == "+" for f in ctl.groups())  # fmt: skip
    # the root port above it has CXL DVSECs, none for CXL devices; 64 bytes hold none
    assert parse_cxl_capability((PCI / "0000:0c:00.0" / "config").read_bytes()) is None
    assert parse_cxl_capability((PCI / "0000:0d:00.0" / "config").read_bytes()[:64]) is None


def test_list_shows_each_memdevs_and_gpus_link_as_lspci_does() -> None:
    tree = ROOT / "tests" / "data" / "trees" / "two-dev" / "region"
    p = _pycxl("list", "-M", "--sysroot", str(tree))
    assert p.returncode == 0, p.stderr
    assert re.search(r"mem0 .* 32GT/s x16", p.stdout), p.stdout
    doc = json.loads(_pycxl("list", "-M", "--json", "--sysroot", str(tree)).stdout)
    link = doc[0]["pcie_link"]
    assert (link["speed_gts"], link["width"], link["downgraded"]) == (32.0, 16, False)
    assert link["bytes_per_s"] == round(bandwidth(32.0, 16) or 0)
    p = _pycxl("list", "-G", "--json", "--sysroot", str(ROOT / "tests/data/gpu/h200"))
    assert json.loads(p.stdout)[0]["pcie_link"]["lspci"] == "32GT/s x16"


def test_a_downtrained_link_is_marked_as_lspci_marks_it(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "tests/data/trees/two-dev/region", tree, symlinks=True)
    dev = tree / "sys/bus/pci/devices/0000:0d:00.0"
    dev = dev.resolve()
    (dev / "current_link_speed").write_text("16.0 GT/s PCIe\n")
    (dev / "current_link_width").write_text("8\n")
    p = _pycxl("list", "-m", "mem0", "--sysroot", str(tree))
    assert "16GT/s (downgraded) x8 (downgraded) of 32GT/s x16" in p.stdout, p.stdout


# --- the live machine ---------------------------------------------------------------------
def test_every_figure_this_host_lacks_says_why_never_zero() -> None:
    (report,) = pycxl.top(0.2, 1)
    for row in (*report.gpus, *report.nodes):
        for figure in (MEM_READ, MEM_WRITE):
            if row.kind == "node":
                assert (figure in row.figures) != (figure in row.missing), row
        for m in row.missing.values():
            assert m.reason and " " not in m.short
        doc = top_row_json(row)
        for key, why in doc["missing"].items():
            assert doc[key] is None and why
    dram0 = next(r for r in report.nodes if r.name == "dram0")
    assert dram0.value(ALLOC) is not None and dram0.value(LOCAL) is not None


def test_node_rows_and_the_process_view_rise_with_a_bandwidth_run() -> None:
    """The bench places its arrays on dram0, on base pages. The process view shows them
    resident there while it runs; and in the interval where its anonymous memory grew
    most, the node's rows around it count at least the pages it gained (each new
    anonymous page is an allocation; whatever else this shared machine allocates only
    adds; the neighbouring intervals too, since a busy machine can read the counters and
    the process's maps a moment apart), and the node's allocations over the run at least
    the pages the bench placed."""
    reports, result = bandwidth_under_top("dram0", "256M", 0.25)
    pages = int(result["pages_on_node"])
    dram0 = [next(n for n in r.nodes if n.name == "dram0") for r in reports]
    grew = [sum(n.anonymous_change_per_s for n in r.process.nodes if n.name == "dram0")
            if r.process is not None else 0.0 for r in reports]  # fmt: skip
    i = max(range(len(reports)), key=grew.__getitem__)
    assert grew[i] * reports[i].interval_s >= 0.1 * pages * 4096, (grew, pages)  # a burst
    around = range(max(i - 1, 0), min(i + 2, len(reports)))
    allocated = sum((dram0[j].value(ALLOC) or 0.0) * reports[j].interval_s for j in around)
    gained = grew[i] * reports[i].interval_s / 4096
    assert allocated >= 0.8 * gained, ([dram0[j] for j in around], gained)
    counted = sum((n.value(ALLOC) or 0.0) * r.interval_s for n, r in zip(dram0, reports,
                                                                        strict=True))  # fmt: skip
    assert counted >= pages, (counted, pages)
    resident = max(sum(n.resident for n in r.process.nodes if n.name == "dram0")
                   for r in reports if r.process is not None)  # fmt: skip
    assert resident >= 0.9 * pages * 4096, (resident, pages)


# --- the command -----------------------------------------------------------------------------
def test_lines_json_and_exit_statuses() -> None:
    p = _pycxl("top", "-c", "2", "-d", "0.2", "-b")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    header = next(line for line in lines if line.startswith("#time") and " node " in line)
    rows = [line.split() for line in lines if not line.startswith("#")]
    assert len(rows) == 2 * len(pycxl.snapshot(gpus=False).nodes), p.stdout
    assert all(len(r) == len(header.split()) for r in rows), p.stdout
    names = {n.name for n in pycxl.snapshot(gpus=False).nodes} | {"dram", "cxl", "cpuless"}
    words = {f for r in rows for f in r if not re.fullmatch(r"[-+0-9.:]+", f)} - names
    for short in words:  # each missing figure's word is explained in a comment
        assert any(line.startswith(f"# {short} (") for line in lines), (short, p.stdout)
    doc = json.loads(_pycxl("top", "--once", "-d", "0.2", "--json").stdout)
    assert set(doc) == {"time", "interval_s", "gpus", "nodes", "process", "absent"}
    assert doc["nodes"][0]["allocations_per_s"] is not None
    p = _pycxl("top", "-d", "0.2", "-b", "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert p.returncode == 3 and "ended" in p.stdout, p.stdout + p.stderr
    assert _pycxl("top", "--once", "-c", "2").returncode == 2
    assert _pycxl("top", "-c", "1", "-p", "1", "--", "true").returncode == 2
    assert _pycxl("top", "-c", "1", "--", "/nonexistent").returncode == 127
    p = _pycxl("top", "-c", "1", "-p", "999999999")
    assert p.returncode in (2, 5) and "999999999" in p.stderr
