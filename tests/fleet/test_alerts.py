"""The shipped Prometheus alerting rules, run by Prometheus' own ``promtool test rules``
on what pycxl writes: the textfiles of ``pycxl check`` and ``pycxl stat`` on recorded
trees (whole, and edited to break one thing each), read back through a real
node_exporter; each host's history is healthy first, then broken. Every rule is checked
at every evaluation time given, so an alert that fires where it should not fails too.
The metric names themselves pass ``promtool check metrics`` and node_exporter's
conventions. Poison needs a device's mailbox: tests/kernel/test_i_operations.py runs
the poison rule in the testbed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import node_exporter
from tests.fleet import alerting
from tests.fleet.trees import EDITS, FRESH, REGION, edited_tree, health_event_log

ROOT = Path(__file__).resolve().parents[2]


def _need(tool: str | None, package: str) -> str:
    if tool is None:
        if os.environ.get("PYCXL_REQUIRE_TESTBED") == "1":
            pytest.fail(f"{package} is not installed (scripts/setup-test-env.sh)")
        pytest.skip(f"{package} is not installed")
    return tool


def _pycxl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycxl.cli.main", *args], capture_output=True,
                          text=True, check=False)  # fmt: skip


def _scraped(tmp: Path, tree: Path, *check_args: str, stat_only: bool = False
             ) -> dict[str, float]:  # fmt: skip
    """The pycxl series node_exporter serves after check and stat (or stat alone) wrote
    their textfiles for ``tree``."""
    exporter = _need(node_exporter.binary(), "prometheus-node-exporter")
    folder = tmp / f"textfiles-{len(list(tmp.glob('textfiles-*')))}"
    folder.mkdir()
    if not stat_only:
        p = _pycxl("check", "--sysroot", str(tree), "--textfile",
                   str(folder / "pycxl-check.prom"), *check_args)  # fmt: skip
        assert p.returncode in (0, 6, 7), p.stderr
    p = _pycxl("stat", "--sysroot", str(tree), "--textfile", str(folder / "pycxl-stat.prom"))
    assert p.returncode == 0, p.stderr
    lines = node_exporter.scrape(str(folder), exporter)
    assert "node_textfile_scrape_error 0" in lines, lines[-20:]
    return alerting.samples(lines)


def test_the_rules_are_valid_and_every_annotation_renders() -> None:
    exe = _need(alerting.promtool(), "prometheus (promtool)")
    p = subprocess.run([exe, "check", "rules", str(alerting.RULES)], capture_output=True,
                       text=True, check=False)  # fmt: skip
    assert p.returncode == 0 and "SUCCESS: 16 rules found" in p.stdout, p.stdout + p.stderr
    for name, rule in alerting.rules().items():
        assert set(rule["annotations"]) == {"summary", "description"}, name
        assert rule["labels"]["severity"], name
        for text in rule["annotations"].values():
            alerting.render(text, {})  # only $labels templates


def test_alerts_fire_on_pycxls_own_series_and_only_there(tmp_path: Path) -> None:
    _need(alerting.promtool(), "prometheus (promtool)")
    good = _scraped(tmp_path, REGION)
    stat_only = _scraped(tmp_path, REGION, stat_only=True)
    broken = {e: _scraped(tmp_path, edited_tree(tmp_path / e, e)) for e in EDITS}
    events = health_event_log(tmp_path / "events.jsonl")
    health = _scraped(tmp_path, REGION, "--events", str(events))
    short = _scraped(tmp_path, REGION, "--expect", "cxl0=1G")
    unused = _scraped(tmp_path, FRESH)

    cxl0 = {"node": "1", "target": "cxl0", "tier": "cxl"}
    dram0 = {"node": "0", "target": "dram0", "tier": "dram"}
    promoted = 'pycxl_node_promoted_pages_total{node="0",target="dram0",tier="dram"}'
    demoted = 'pycxl_node_demoted_pages_total{node="1",target="cxl0",tier="cxl"}'
    assert promoted in good and demoted in good, sorted(good)
    P = alerting.Phase
    hosts: dict[str, list[alerting.Phase]] = {
        "ok": [P(90, good)],
        "blocks": [P(10, good), P(80, broken["blocks-offline"])],
        "disabled": [P(10, good), P(80, broken["memdev-disabled"])],
        "gone": [P(10, good), P(80, broken["memdev-gone"])],
        "uncommitted": [P(10, good), P(80, broken["region-uncommitted"])],
        "health": [P(10, good), P(80, health)],
        "short": [P(10, good), P(80, short)],
        "unused": [P(10, good), P(80, unused)],
        # cron stopped at minute 10: the files stay, their times do not move
        "stale": [P(10, good), P(80, good, fresh=False)],
        # the check's textfile removed at minute 10 (stat's stays)
        "removed": [P(10, good), P(80, stat_only)],
        # 40000 pages/s (a minute apart: x60) promoted to dram0, demoted from cxl0
        "storm": [P(10, good), P(80, good, rates={promoted: 40000 * 60, demoted: 40000 * 60})],
    }
    series = [s for host, phases in hosts.items()
              for s in alerting.input_series(phases, f"{host}:9100")]  # fmt: skip

    def at(host: str, alert: str, labels: dict[str, str]) -> dict[str, Any]:
        return alerting.expected(alert, {"instance": f"{host}:9100", "job": "node", **labels})

    region0 = {"region": "region0", "node": "1", "target": "cxl0"}
    mem1 = {"memdev": "mem1", "serial": "0x2"}
    # minute 12: broken for 2 minutes, short of every rule's 'for' (only the rules with
    # none fire); minute 89: every broken host alerts
    early = {
        "PycxlMemdevHealth": [at("health", "PycxlMemdevHealth", {
            **mem1, "check": "health", "subject": "mem1", "severity": "critical"})],
    }  # fmt: skip
    late = early | {
        "PycxlMemoryBlocksOffline": [at("blocks", "PycxlMemoryBlocksOffline", region0)],
        "PycxlMemdevDisabled": [at("disabled", "PycxlMemdevDisabled", mem1)],
        "PycxlMemdevMissing": [at("gone", "PycxlMemdevMissing", {"serial": "0x2"})],
        "PycxlRegionNotCommitted": [at("uncommitted", "PycxlRegionNotCommitted", region0)],
        "PycxlBelowExpectation": [at("short", "PycxlBelowExpectation", {
            "check": "capacity", "subject": "cxl0", "target": "cxl0", "node": "1",
            "severity": "critical"})],
        "PycxlCheckWarning": [at("unused", "PycxlCheckWarning", {
            "check": "memdev-in-region", "subject": m, "memdev": m, "serial": s,
            "severity": "warning"}) for m, s in (("mem0", "0x1"), ("mem1", "0x2"))],
        "PycxlCheckStale": [at("stale", "PycxlCheckStale", {})],
        "PycxlStatStale": [at("stale", "PycxlStatStale", {})],
        "PycxlMetricsGone": [at("removed", "PycxlMetricsGone", {})],
        "PycxlPromotionStorm": [at("storm", "PycxlPromotionStorm", dram0)],
        "PycxlDemotionStorm": [at("storm", "PycxlDemotionStorm", cxl0)],
    }  # fmt: skip
    p = alerting.run(tmp_path, series, {9: {}, 12: early, 89: late})
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert "SUCCESS" in p.stdout


def test_exported_names_follow_node_exporter_conventions(tmp_path: Path) -> None:
    """``promtool check metrics`` (Prometheus' linter) on both textfiles, and what it
    does not check: base units, no percent, counters and only counters end in
    ``_total``, and nothing node_exporter's meminfo_numa collector already exports."""
    exe = _need(alerting.promtool(), "prometheus (promtool)")
    events = health_event_log(tmp_path / "events.jsonl")
    files = []
    for args in (["check", "--events", str(events), "--textfile"], ["stat", "--textfile"]):
        out = tmp_path / f"{args[0]}.prom"
        p = _pycxl(*args, str(out), "--sysroot", str(REGION))
        assert p.returncode in (0, 7), p.stderr
        files.append(out)
    # pycxl top on this host, and as it writes on a GPU host (counted, sampled)
    p = _pycxl("top", "--once", "-d", "0.2", "--textfile", str(tmp_path / "top.prom"))
    assert p.returncode == 0, p.stderr
    files += [tmp_path / "top.prom", _top_textfile(tmp_path / "gpu.prom", 0.5),
              _top_textfile(tmp_path / "sampled.prom", 0.5, sampled=1e9)]  # fmt: skip
    for out in files:
        text = out.read_text()
        lint = subprocess.run([exe, "check", "metrics"], input=text, capture_output=True,
                              text=True, check=False)  # fmt: skip
        assert lint.returncode == 0, lint.stdout + lint.stderr
        types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
        assert types, text
        for name, kind in types.items():
            assert name.startswith("pycxl_")
            assert name.endswith("_total") == (kind == "counter"), name
            assert not re.search(r"_(percent|gts|gb|mb|kb|ms|us|ns|celsius_total)$", name), name
            assert not re.match(r"pycxl_node_(memory_(total|free)|numa_(hit|miss|foreign))", name)


def test_the_docs_list_every_exported_metric(tmp_path: Path) -> None:
    docs = (ROOT / "docs" / "operations.md").read_text()
    section = docs[docs.index("### Metrics") :]
    documented = set(re.findall(r"`([a-z_]+)`", section.split("\n## ", 1)[0]))
    events = health_event_log(tmp_path / "events.jsonl")
    names = set()
    for args in (["check", "--events", str(events), "--expect", "cxl0=1G"], ["stat"]):
        out = tmp_path / f"{args[0]}.prom"
        assert _pycxl(*args, "--textfile", str(out), "--sysroot", str(REGION)).returncode in (0, 7)
        names |= set(re.findall(r"^# TYPE pycxl_(\S+) ", out.read_text(), re.M))
    for path in (_top_textfile(tmp_path / "gpu.prom", 0.5),
                 _top_textfile(tmp_path / "sampled.prom", 0.5, sampled=1e9)):  # fmt: skip
        names |= set(re.findall(r"^# TYPE pycxl_(\S+) ", path.read_text(), re.M))
    assert names - documented == set(), names - documented


H200 = ROOT / "tests" / "data" / "gpu" / "h200"
LINK_BYTES_PER_S = 55e9  # a pinned copy's rate on the H200 host (anchors), 87% of Gen5 x16


def _top_textfile(path: Path, busy: float, *, sampled: float | None = None) -> Path:
    """What ``pycxl top --textfile`` writes on the recorded H200 host: its GPU and PCIe
    link come from the recorded tree, through pycxl's own report and metrics; what NVML
    would count there (this machine has no GPU) is given: the link's counters (or,
    ``sampled``, NVML's sampled rate) and how busy the GPU's memory was."""
    from pycxl.counters.base import HBM_BUSY, PCIE_RX, PCIE_TX, Reading
    from pycxl.ops.metrics import top_metrics
    from pycxl.ops.prometheus import write_textfile
    from pycxl.ops.top import report
    from pycxl.resolve.system import snapshot

    gpu = ("gpu", 0)

    def nvml(t: float) -> Reading:
        if sampled is not None:
            return Reading("nvml", t, rates={(gpu, PCIE_RX): sampled, (gpu, PCIE_TX): 0.0,
                                             (gpu, HBM_BUSY): busy})  # fmt: skip
        return Reading("nvml", t, totals={(gpu, PCIE_RX): 0.0, (gpu, PCIE_TX): 0.0},
                       rates={(gpu, HBM_BUSY): busy})  # fmt: skip

    system = snapshot(str(H200))
    write_textfile(str(path), top_metrics(report(system, [nvml(1.0)], [nvml(0.0)])))
    return path


def _top_scraped(tmp: Path, busy: float, *, sampled: float | None = None) -> dict[str, float]:
    """The pycxl series node_exporter serves from ``_top_textfile``."""
    exporter = _need(node_exporter.binary(), "prometheus-node-exporter")
    folder = tmp / f"textfiles-{len(list(tmp.glob('textfiles-*')))}"
    folder.mkdir()
    _top_textfile(folder / "pycxl-top.prom", busy, sampled=sampled)
    lines = node_exporter.scrape(str(folder), exporter)
    assert "node_textfile_scrape_error 0" in lines, lines[-20:]
    return alerting.samples(lines)


def test_the_starving_gpu_alert_fires_on_a_saturated_link_with_idle_memory(tmp_path: Path) -> None:
    """A GPU's PCIe link at 55 GB/s (87% of its 63 GB/s) for 80 minutes: the alert fires
    where its memory idles (counted, or sampled by NVML), not where its memory is busy or
    the link is idle; a top that stopped writing is stale."""
    _need(alerting.promtool(), "prometheus (promtool)")
    idle = _top_scraped(tmp_path, busy=0.02)
    busy = _top_scraped(tmp_path, busy=0.6)
    sampled_quiet = _top_scraped(tmp_path, busy=0.02, sampled=0.0)
    sampled_full = _top_scraped(tmp_path, busy=0.02, sampled=LINK_BYTES_PER_S)
    rx = next(s for s in idle if s.startswith("pycxl_gpu_link_receive_bytes_total{"))
    assert 'link="pcie"' in rx and 'gpu="gpu0"' in rx, sorted(idle)
    assert idle[rx.replace("receive_bytes_total", "max_bytes_per_second")] > LINK_BYTES_PER_S / 0.9
    full = {rx: LINK_BYTES_PER_S * 60}  # per minute
    P = alerting.Phase
    hosts = {
        "gpu-quiet": [P(90, idle)],
        "gpu-starved": [P(10, idle), P(80, idle, rates=full)],
        "gpu-busy": [P(10, busy), P(80, busy, rates=full)],
        "gpu-sampled": [P(10, sampled_quiet), P(80, sampled_full)],
        "top-stale": [P(10, idle), P(80, idle, fresh=False)],
    }
    series = [s for host, phases in hosts.items()
              for s in alerting.input_series(phases, f"{host}:9100")]  # fmt: skip

    def at(host: str, alert: str, labels: dict[str, str]) -> dict[str, Any]:
        return alerting.expected(alert, {"instance": f"{host}:9100", "job": "node", **labels})

    late = {
        "PycxlGpuLinkSaturated": [at(h, "PycxlGpuLinkSaturated", {"gpu": "gpu0"})
                                  for h in ("gpu-starved", "gpu-sampled")],
        "PycxlTopStale": [at("top-stale", "PycxlTopStale", {})],
    }  # fmt: skip
    # minute 15: saturated for 5 minutes, short of the rule's 10; minute 89: firing
    p = alerting.run(tmp_path, series, {9: {}, 15: {}, 89: late})
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert "SUCCESS" in p.stdout
