"""Operations on recorded trees and on this host: the mailbox payload decoders against
the CXL specification's layouts and ndctl's documented JSON, expectations, check
findings and exit codes, stat reports, and the Prometheus text a real node_exporter
reads back."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pycxl.base.errors import InvalidRequestError
from pycxl.base.sysfs import Sysfs
from pycxl.base.trace import parse_line
from pycxl.byname.to_json import alert_config_json, firmware_info_json, health_json
from pycxl.cxl.health import (
    HEALTH,
    decode_alert_config,
    decode_fw_info,
    decode_health,
    event_health,
)
from pycxl.ops.check import parse_expectations, run_check
from pycxl.ops.metrics import check_metrics, stat_metrics
from pycxl.ops.prometheus import Metric, check_textfile_path, render, write_textfile
from pycxl.ops.stat import stat
from pycxl.pci.link import parse_speed, read_link
from pycxl.resolve.system import snapshot
from tests import node_exporter

DATA = Path(__file__).resolve().parents[1] / "data"
NDCTL_EXAMPLE = json.loads((DATA / "ndctl" / "list-health-alert-example.json").read_text())


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycxl.cli.main", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, check=False)  # fmt: skip


# --- mailbox payloads: CXL 2.0 8.2.9.5.3.1-2 and 8.2.9.2.1, byte by byte ---------------
def test_health_payload_decodes_to_ndctls_documented_object() -> None:
    # ndctl's cxl-list(1) example: all three health bits, media 'data lost' (3),
    # temperature critical (2 << 2), corrected volatile warning (1 << 4)
    payload = bytes([0x07, 0x03, (2 << 2) | (1 << 4), 15]) + struct.pack("<hIII", 25, 10, 20, 30)
    assert len(payload) == HEALTH.size == 0x12
    h = decode_health(payload)
    assert health_json(h) == NDCTL_EXAMPLE["health"]
    assert h.critical and "hw replacement needed" in h.problems


def test_health_unreported_values_and_levels() -> None:
    payload = bytes([0x02, 0x00, 0x01, 0xFF]) + struct.pack("<hIII", -1, 0, 0, 0)
    h = decode_health(payload)
    j = health_json(h)
    assert j["life_used_percent"] is None and j["temperature"] is None
    assert j["performance_degraded"] and not j["hw_replacement_needed"] and j["media_normal"]
    assert j["ext_life_used"] == "warning"
    assert not h.critical and h.problems == ["performance degraded", "life used warning"]
    healthy = decode_health(bytes(4) + struct.pack("<hIII", 30, 0, 0, 0))
    assert healthy.problems == [] and not healthy.critical


def test_alert_config_payload_in_spec_order() -> None:
    # ndctl's example: only the corrected-volatile threshold valid and writable
    example = decode_alert_config(bytes([0x08, 0x08]) + bytes(14))
    assert alert_config_json(example) == NDCTL_EXAMPLE["alert_config"]
    # each field in its place: distinct values
    payload = bytes([0x1F, 0x05, 90, 75]) + struct.pack("<hhhhHH", 100, -20, 85, -10, 300, 400)
    j = alert_config_json(decode_alert_config(payload))
    assert j["life_used_crit_alert_threshold"] == 90 and j["life_used_prog_warn_threshold"] == 75
    assert j["dev_over_temperature_crit_alert_threshold"] == 100
    assert j["dev_under_temperature_crit_alert_threshold"] == -20
    assert j["dev_over_temperature_prog_warn_threshold"] == 85
    assert j["dev_under_temperature_prog_warn_threshold"] == -10
    assert j["corrected_volatile_mem_err_prog_warn_threshold"] == 300
    assert j["corrected_pmem_err_prog_warn_threshold"] == 400
    assert all(j[k] for k in j if k.endswith("_valid"))
    writable = [k for k in j if k.endswith("_writable") and j[k]]
    assert writable == ["life_used_prog_warn_threshold_writable",
                        "dev_under_temperature_prog_warn_threshold_writable"]  # fmt: skip


def test_firmware_info_payload() -> None:
    payload = bytearray(0x50)
    payload[0], payload[1] = 2, 0b010_010  # two slots, slot 2 active (and staged)
    payload[16 : 16 + 6] = b"FW 1.0"
    payload[32 : 32 + 6] = b"FW 2.0"
    fw = decode_fw_info(bytes(payload))
    assert fw.slots == 2 and fw.active_slot == 2 and fw.revisions == ("FW 1.0", "FW 2.0")
    assert fw.staged_slot == 2 and not fw.online_activate
    payload[1], payload[2] = 0b000_001, 1  # slot 1 active, none staged; online activation
    fw = decode_fw_info(bytes(payload))
    assert (fw.active_slot, fw.staged_slot, fw.online_activate) == (1, 0, True)
    assert firmware_info_json(fw)["staged_slot"] is None


# --- trace lines, as the kernel prints them (recorded in the testbed after injecting a
# memory-module, a general-media and a DRAM event through QEMU) ------------------------
TRACE = (DATA / "trace" / "cxl-events.txt").read_text().splitlines()


def test_trace_lines_parse_with_their_fields() -> None:
    events = [e for e in (parse_line(ln) for ln in TRACE) if e is not None]
    names = {e.name for e in events}
    assert names == {"cxl_memory_module", "cxl_general_media", "cxl_dram"}
    (mm,) = [e for e in events if e.name == "cxl_memory_module"][:1]
    assert mm.fields["memdev"] == "mem0" and "REPLACEMENT_NEEDED" in mm.fields["health_status"]
    h = event_health({"fields": mm.fields})
    assert h.health_status & 0x4 and h.critical
    (gm,) = [e for e in events if e.name == "cxl_general_media"][:1]
    assert int(gm.fields["dpa"], 16) == 4096 and gm.fields["region"] == "region0"
    assert gm.fields["descriptor"] == "UNCORRECTABLE_EVENT|THRESHOLD_EVENT"
    assert parse_line("# tracer: nop") is None


# --- expectations ---------------------------------------------------------------------
def test_expectations_parse_and_refuse_bad_ones() -> None:
    exp = parse_expectations(["cxl0=512G", "dram0 = 64G", "regions=2", "memdevs=4"])
    assert exp.capacities == {"cxl0": 512 << 30, "dram0": 64 << 30}
    assert exp.counts == {"regions": 2, "memdevs": 4}
    bad_ones = (("cxl0", "NAME=SIZE"), ("cxl0=lots", "cxl0=lots"),
                ("gpu0=80G", "not a memory node"), ("regions=two", "whole number"))  # fmt: skip
    for bad, words in bad_ones:
        with pytest.raises(InvalidRequestError, match=words):
            parse_expectations([bad])


# --- check on recorded trees ----------------------------------------------------------
def _findings(tree: str, *items: str) -> dict[tuple[str, str], tuple[str, str]]:
    root = str(DATA / "trees" / "two-dev" / tree / "")
    report = run_check(snapshot(root, gpus=False), parse_expectations(items), event_log="",
                       device_health=False, fs=Sysfs(root))  # fmt: skip
    return {(f.check, f.subject): (f.severity, f.message) for f in report.findings}


def test_check_on_the_recorded_region_is_clean() -> None:
    found = _findings("region", "cxl0=512M", "regions=1", "memdevs=2")
    bad = {k: v for k, v in found.items() if v[0] in ("warning", "failure")}
    assert bad == {}
    assert found[("region-online", "region0")][0] == "ok"
    assert found[("capacity", "cxl0")][0] == "ok"
    assert found[("memdev-enabled", "mem0")][0] == "ok"
    assert ("pcie-link", "mem0 (0000:0d:00.0)") in found or any(
        k[0] == "pcie-link" for k in found)  # fmt: skip


def test_check_on_the_fresh_tree_finds_unused_memdevs_and_missing_expectations() -> None:
    found = _findings("fresh", "cxl0=512M", "regions=1")
    assert found[("memdev-in-region", "mem0")][0] == "warning"
    sev, msg = found[("capacity", "cxl0")]
    assert sev == "failure" and "not present" in msg
    assert found[("regions-count", "host")][0] == "failure"


def test_check_cli_exit_codes_on_recorded_trees() -> None:
    region = str(DATA / "trees" / "two-dev" / "region")
    fresh = str(DATA / "trees" / "two-dev" / "fresh")
    assert cli("check", "--sysroot", region, "--no-health", "--events", "").returncode == 0
    p = cli("check", "--sysroot", fresh, "--no-health", "--events", "")
    assert p.returncode == 6 and "memdev-in-region" in p.stdout
    p = cli("check", "--sysroot", region, "--no-health", "--events", "", "-e", "cxl0=1T")
    assert p.returncode == 7 and "1.00 TiB expected" in p.stdout
    p = cli("check", "--sysroot", region, "-e", "cxl0=big")
    assert p.returncode == 2 and "cxl0=big" in p.stderr


def test_check_without_cxl_says_so_with_its_code(tmp_path: Path) -> None:
    if os.path.isdir("/sys/bus/cxl/devices") and os.listdir("/sys/bus/cxl/devices"):
        pytest.skip("this host has CXL devices")
    p = cli("check", "--json")
    assert p.returncode == 4, p.stderr
    doc = json.loads(p.stdout)
    assert doc["status"] == "no-cxl"
    assert [f["check"] for f in doc["findings"] if f["check"] == "cxl-present"]


def test_pcie_links_from_the_recorded_tree() -> None:
    assert parse_speed("32.0 GT/s PCIe") == 32.0 and parse_speed("Unknown") is None
    fs = Sysfs(str(DATA / "trees" / "two-dev" / "region"))
    topo = snapshot(str(DATA / "trees" / "two-dev" / "region"), gpus=False)
    for m in topo.cxl.memdevs:
        link = read_link(m.host, fs)
        assert link is not None and link.speed is not None and link.width is not None


# --- stat -----------------------------------------------------------------------------
def test_stat_reports_on_the_recorded_region() -> None:
    root = str(DATA / "trees" / "two-dev" / "region")
    (report,) = stat(snapshot(root, gpus=False))
    by_name = {n.name: n for n in report.nodes}
    assert by_name["cxl0"].tier == "cxl" and by_name["cxl0"].total == 512 << 20
    assert report.interval_s is None and report.system_rates is None
    assert report.tiering is not None
    cxl_node = by_name["cxl0"].node
    assert report.tiering.tier_of(cxl_node) not in (None, report.tiering.tier_of(0))


def test_stat_rates_on_this_host() -> None:
    p = cli("stat", "0.2", "2", "--json")
    assert p.returncode == 0, p.stderr
    first, second = (json.loads(ln) for ln in p.stdout.splitlines())
    assert first["interval_s"] is None and first["nodes"][0]["rates_per_s"] is None
    assert 0.15 < second["interval_s"] < 2
    assert second["nodes"][0]["rates_per_s"]["numa_hit"] >= 0
    assert set(second["system"]["rates_per_s"]) == set(second["system"]["totals"])
    for bad, words in ((["0"], "above 0"), (["1", "0"], "0"), (["x"], "not a number")):
        p = cli("stat", *bad)
        assert p.returncode == 2 and words in p.stderr


# --- Prometheus -----------------------------------------------------------------------
def test_exposition_text_escapes_and_orders() -> None:
    m = Metric("x_total", 'help with "quotes"', "counter")
    m.add(3, memdev='a"b', node=None)
    m.add(None, memdev="skipped")
    text = render([m, Metric("empty", "no samples")])
    assert text == ('# HELP pycxl_x_total help with \\"quotes\\"\n# TYPE pycxl_x_total counter\n'
                    'pycxl_x_total{memdev="a\\"b"} 3\n')  # fmt: skip


def test_textfile_paths_are_checked_before_writing(tmp_path: Path) -> None:
    for bad, words in ((tmp_path / "x.txt", ".prom"), (tmp_path / "no" / "x.prom", "not exist")):
        with pytest.raises(InvalidRequestError, match=words):
            check_textfile_path(str(bad))
    p = cli("stat", "--textfile", str(tmp_path / "missing" / "s.prom"))
    assert p.returncode == 2 and "does not exist" in p.stderr
    target = tmp_path / "t.prom"
    write_textfile(str(target), [Metric("a", "b")])
    assert target.read_text() == "\n" and oct(target.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["t.prom"]  # no temporary left


def test_node_exporter_reads_what_check_and_stat_write(tmp_path: Path) -> None:
    exporter = node_exporter.binary()
    if exporter is None:
        if os.environ.get("PYCXL_REQUIRE_TESTBED") == "1":
            pytest.fail("prometheus-node-exporter is not installed (scripts/setup-test-env.sh)")
        pytest.skip("prometheus-node-exporter is not installed")
    root = str(DATA / "trees" / "two-dev" / "region")
    system = snapshot(root, gpus=False)
    report = run_check(system, event_log="", device_health=False, fs=Sysfs(root))
    write_textfile(str(tmp_path / "check.prom"), check_metrics(report, system))
    (st,) = stat(system)
    write_textfile(str(tmp_path / "stat.prom"), stat_metrics(st))
    lines = node_exporter.scrape(str(tmp_path), exporter)
    assert "node_textfile_scrape_error 0" in lines, lines[-20:]
    assert "pycxl_check_status 0" in lines
    assert 'pycxl_region_committed{node="1",region="region0",target="cxl0"} 1' in lines
    assert 'pycxl_node_info{node="1",target="cxl0",tier="cxl"} 1' in lines
    assert 'pycxl_pcie_link_transfers_per_second{device="0000:0d:00.0",memdev="mem0"} 3.2e+10' in (
        lines)  # fmt: skip
    assert 'pycxl_memdev_ram_bytes{memdev="mem0",serial="0x1"} 2.68435456e+08' in lines
