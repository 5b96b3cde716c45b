"""Operating a host, proven on the real kernel with faults injected through QEMU: device
health from the mailbox (and what QEMU's device cannot answer), ``pycxl check`` turning
from 0 to its failure code on an injected health event that ``monitor`` shows, poison in
the poison list with its region and node, ``stat`` seeing pages move between tiers, and
Prometheus metrics read back from a real node_exporter.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pycxl
from pycxl.base.trace import find_tracefs
from pycxl.cxl.health import FirmwareInfo, read_health
from pycxl.cxl.mailbox import Unsupported
from pycxl.cxl.region_layout import RegionRequest
from pycxl.numa.pages import migrate, pages_by_node
from pycxl.resolve.system import snapshot
from tests import node_exporter
from tests.kernel.kernel_helpers import ndctl, pycxl_cli

CHECK_WARNING, CHECK_FAILURE = 6, 7
MiB = 1 << 20


def _as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    """pycxl's CLI run as user 'nobody' (the checks that must work without root), in a
    forked child: this interpreter lives under /root, which nobody cannot read, so
    everything the command imports is imported before the child gives up root."""
    import importlib
    import tempfile

    for mod in ("pycxl.cli.main", "pycxl.cli.check_cmd", "pycxl.cli.list_cmd",
                "pycxl.cli.monitor_cmd", "pycxl.ops.check", "pycxl.ops.monitor",
                "pycxl.byname.listing", "pycxl.cxl.poison", "pyudev"):  # fmt: skip
        importlib.import_module(mod)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (pytest swapped them)
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                os.setgroups([])
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
                from pycxl.cli.main import main

                code = main(list(args))
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(list(args), os.waitstatus_to_exitcode(status),
                                           out.read(), err.read())  # fmt: skip


def _inject(kind: str, memdev: str, **fields: object) -> None:
    sets = [f"--set={k.replace('_', '-')}={json.dumps(v)}" for k, v in fields.items()]
    p = pycxl_cli("testbed", "--inject", kind, "--memdev", memdev, *sets)
    assert p.returncode == 0, p.stderr
    assert f"injected {kind} into {memdev}" in p.stdout


def _check(*args: str) -> tuple[int, dict[str, Any]]:
    p = pycxl_cli("check", "--json", *args)
    assert p.returncode in (0, CHECK_WARNING, CHECK_FAILURE), p.stderr
    return p.returncode, json.loads(p.stdout)


def _bad(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(f["severity"], f["check"], f["subject"]) for f in doc["findings"]
            if f["severity"] in ("warning", "failure")]  # fmt: skip


class Monitor:
    """``pycxl monitor`` in the background, its JSON lines collected."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pycxl.cli.main", "monitor", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()  # the monitor says when it listens
        assert "monitoring" in line, line + self.proc.stderr.read()

    def until(self, pred: Any, timeout: float = 20.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            rec: dict[str, Any] = json.loads(line)
            if pred(rec):
                return rec
        raise AssertionError("the monitor did not show the event")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=20)


def _pycxl_instances() -> list[str]:
    base = find_tracefs()  # None once the monitor unmounted the tracefs it mounted
    return [] if base is None else [d for d in os.listdir(f"{base}/instances")
                                    if d.startswith("pycxl-")]  # fmt: skip


@pytest.fixture
def region() -> Iterator[pycxl.RegionResult | None]:
    """A 2-way region, movable (so it can always be destroyed), in the guest only: on
    the host the test itself runs in the guest."""
    if os.environ.get("PYCXL_IN_TESTBED") != "1":
        yield None
        return
    yield pycxl.create_region(RegionRequest(ways=2, zone="movable"))


@pytest.mark.kernel(topology="two-dev")
def test_mailbox_health_alerts_and_firmware_on_the_real_kernel() -> None:
    cxl = snapshot(gpus=False).cxl
    for m in cxl.memdevs:
        h = read_health(m.name)
        # QEMU's type-3 device has no Get Health Info: the kernel passes the command on
        # and the device refuses it; pycxl says so instead of failing
        # QEMU 10.0's device has no Get Health Info nor Get Alert Configuration in its
        # command effects log: the kernel refuses both (ENOTTY); pycxl says so, as a
        # finding, and goes on. Get FW Info it answers.
        for part in (h.health, h.alert_config):
            assert isinstance(part, Unsupported), part
            assert "does not support it" in part.reason
        assert isinstance(h.firmware, FirmwareInfo) and h.firmware.slots >= 1
        assert h.firmware.revisions[h.firmware.active_slot - 1].startswith("BWFW VERSION")

    # ndctl's cxl list -H -A prints neither object for these devices; pycxl says why
    p = pycxl_cli("list", "-m", "mem0", "-H", "-A", "--json")
    assert p.returncode == 0, p.stderr
    (ours,) = json.loads(p.stdout)
    (theirs,) = ndctl("-m", "mem0", "-H", "-A")
    for key in ("health", "alert_config"):
        assert key not in theirs and key not in ours
    assert "Get Health Info" in ours["health_unsupported"]
    assert "Get Alert Configuration" in ours["alert_config_unsupported"]

    # not root: the listing still comes, and says why health is missing
    p = _as_nobody("list", "-m", "mem0", "-H", "--json")
    assert p.returncode == 0, p.stderr
    (doc,) = json.loads(p.stdout)
    assert doc["memdev"] == "mem0" and "needs root" in doc["health_unsupported"]


@pytest.mark.kernel(topology="two-dev")
def test_check_fails_on_an_injected_health_event_that_monitor_shows(
    region: pycxl.RegionResult, tmp_path: Path
) -> None:
    code, doc = _check()
    assert code == 0, _bad(doc)
    seen = {(f["check"], f["subject"]) for f in doc["findings"]}
    assert {("memdev-enabled", "mem0"), ("region-online", region.name), ("zone", "cxl0"),
            ("poison", "mem0")} <= seen  # fmt: skip

    log = tmp_path / "events.jsonl"
    mon = Monitor("--log", str(log))
    try:
        _inject("memory-module", "mem0", health_status=4, media_status=0)
        rec = mon.until(lambda r: r["event"] == "cxl_memory_module")
        assert rec["memdev"] == "mem0"
        assert rec["serial"] == snapshot(gpus=False).cxl.memdev("mem0").serial
        assert "REPLACEMENT_NEEDED" in rec["fields"]["health_status"]
        assert _pycxl_instances()  # the monitor's own trace instance, while it runs
    finally:
        assert mon.stop() == -signal.SIGTERM  # ended by it, after its clean-up
    assert _pycxl_instances() == []  # gone with the monitor

    code, doc = _check("--events", str(log))
    assert code == CHECK_FAILURE
    assert ("failure", "health", "mem0") in _bad(doc)
    (f,) = [f for f in doc["findings"] if f["check"] == "health" and f["severity"] == "failure"]
    assert f["subject"] == "mem0" and "hw replacement needed" in f["message"] and f["fix"]
    assert "from its event of" in f["message"]

    # the device reports it is well again: the latest event decides
    mon = Monitor("--log", str(log), "--count", "1")
    _inject("memory-module", "mem0", health_status=0)
    assert mon.proc.wait(timeout=30) == 0
    code, doc = _check("--events", str(log))
    assert code == 0, _bad(doc)


@pytest.mark.kernel(topology="two-dev")
def test_general_media_event_is_placed_on_region_and_node(region: pycxl.RegionResult) -> None:
    mon = Monitor("--count", "1")
    _inject("general-media", "mem1", dpa=4096)
    assert mon.proc.wait(timeout=30) == 0
    assert mon.proc.stdout is not None
    (rec,) = [json.loads(line) for line in mon.proc.stdout.read().splitlines()]
    assert rec["event"] == "cxl_general_media" and rec["memdev"] == "mem1"
    assert rec["dpa"] == 4096
    assert rec["region"] == region.name and rec["node"] == region.numa_node
    assert rec["target"] == "cxl0" and isinstance(rec["hpa"], int)
    r = snapshot(gpus=False).cxl.region(region.name)
    assert r.resource is not None and r.resource <= rec["hpa"] < r.resource + r.size


@pytest.mark.kernel(topology="two-dev")
def test_poison_shows_in_the_list_with_region_and_node(region: pycxl.RegionResult) -> None:
    _inject("poison", "mem0", start=0, length=64)
    try:
        p = pycxl_cli("list", "-m", "mem0", "-L", "--json")
        assert p.returncode == 0, p.stderr
        (doc,) = json.loads(p.stdout)
        (rec,) = doc["media_errors"]
        assert rec["offset"] == 0 and rec["length"] == 64
        assert rec["region"] == region.name and rec["numa_node"] == region.numa_node
        assert rec["target"] == "cxl0" and isinstance(rec["hpa"], int)
        code, cdoc = _check()
        assert code == CHECK_WARNING and ("warning", "poison", "mem0") in _bad(cdoc)
    finally:  # the device keeps its list for the rest of the boot: clear it
        Path("/sys/kernel/debug/cxl/mem0/clear_poison").write_text("0x0")
    p = pycxl_cli("list", "-m", "mem0", "-L", "--json")
    assert json.loads(p.stdout)[0]["media_errors"] == []


@pytest.mark.kernel(topology="two-dev")
def test_the_poison_alert_fires_on_the_checks_own_textfile(
    region: pycxl.RegionResult, tmp_path: Path
) -> None:
    """The shipped PycxlPoison rule, run by promtool on the series a real node_exporter
    serves from ``pycxl check --textfile``: before and after poison reaches mem0's list
    (its mailbox answers only on the real kernel, so this runs here)."""
    from tests.fleet import alerting

    assert alerting.promtool(), "promtool is not installed (scripts/setup-test-env.sh)"
    exporter = node_exporter.binary()
    assert exporter, "prometheus-node-exporter is not installed (scripts/setup-test-env.sh)"
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)

    def served(name: str) -> dict[str, float]:
        folder = tmp_path / name
        folder.mkdir()
        p = pycxl_cli("check", "--textfile", str(folder / "pycxl-check.prom"))
        assert p.returncode in (0, CHECK_WARNING), p.stderr
        return alerting.samples(node_exporter.scrape(str(folder), exporter))

    clean = served("clean")
    _inject("poison", "mem0", start=0, length=64)
    try:
        poisoned = served("poisoned")
    finally:  # the device keeps its list for the rest of the boot: clear it
        Path("/sys/kernel/debug/cxl/mem0/clear_poison").write_text("0x0")
    serial = f"{snapshot(gpus=False).cxl.memdev('mem0').serial:#x}"
    assert poisoned[f'pycxl_memdev_poison_records{{memdev="mem0",serial="{serial}"}}'] == 1
    series = alerting.input_series([alerting.Phase(10, clean), alerting.Phase(20, poisoned)],
                                   "testbed:9100")  # fmt: skip
    fired = alerting.expected("PycxlPoison", {"instance": "testbed:9100", "job": "node",
                                              "memdev": "mem0", "serial": serial})  # fmt: skip
    p = alerting.run(tmp_path, series, {9: {}, 25: {"PycxlPoison": [fired]}})
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


@pytest.mark.kernel(topology="two-dev")
def test_stat_counts_pages_moved_between_tiers(region: pycxl.RegionResult) -> None:
    buf = mmap.mmap(-1, 8 * MiB)  # made and touched first: the emulator is slow
    buf.write(b"x" * len(buf))
    assert region.numa_node is not None and pages_by_node(buf) != {region.numa_node: 2048}
    # reports every 4 s until one counts the move: on a busy host the emulator's slow CXL
    # memory can make the move itself outlast an interval, so no one interval is assumed
    proc = subprocess.Popen([sys.executable, "-m", "pycxl.cli.main", "stat", "4", "--json"],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    try:
        first = json.loads(proc.stdout.readline())  # from here on, inside the second interval
        moved = migrate(buf, region.numa_node)
        assert pages_by_node(buf) == {region.numa_node: 2048}, moved
        deadline = time.monotonic() + 300
        while True:
            second = json.loads(proc.stdout.readline())
            counted = [r["system"]["totals"]["pgmigrate_success"] for r in (first, second)]
            if counted[1] - counted[0] >= 2048 or time.monotonic() > deadline:
                break
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert first["interval_s"] is None and second["interval_s"] > 3.5
    assert counted[1] - counted[0] >= 2048, counted
    rate = second["system"]["rates_per_s"]["pgmigrate_success"]
    assert rate > 0  # over the interval that saw the move
    (cxl0,) = [n for n in second["nodes"] if n["name"] == "cxl0"]
    assert cxl0["tier"] == "cxl" and cxl0["node"] == region.numa_node
    assert cxl0["used"] >= 8 * MiB
    del buf


@pytest.mark.kernel(topology="two-dev")
def test_prometheus_metrics_through_a_real_node_exporter(
    region: pycxl.RegionResult, tmp_path: Path
) -> None:
    exporter = node_exporter.binary()
    assert exporter, "prometheus-node-exporter is not installed (scripts/setup-test-env.sh)"
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
    assert pycxl_cli("check", "--textfile", str(tmp_path / "check.prom")).returncode == 0
    assert pycxl_cli("stat", "--textfile", str(tmp_path / "stat.prom")).returncode == 0
    lines = node_exporter.scrape(str(tmp_path), exporter, "meminfo_numa")
    assert "node_textfile_scrape_error 0" in lines
    node = region.numa_node
    serial = snapshot(gpus=False).cxl.memdev("mem0").serial
    want = [
        "pycxl_check_status 0",
        f'pycxl_memdev_enabled{{memdev="mem0",serial="{serial:#x}"}} 1',
        f'pycxl_region_committed{{node="{node}",region="{region.name}",target="cxl0"}} 1',
    ]
    for w in want:
        assert w in lines, w
    # the node's memory is node_exporter's own; pycxl_node_info names its tier, on the
    # same node label, for a join
    assert f'pycxl_node_info{{node="{node}",target="cxl0",tier="cxl"}} 1' in lines
    (total,) = [ln for ln in lines if ln.startswith(f'node_memory_numa_MemTotal{{node="{node}"}}')]
    tier = snapshot(gpus=False).tier(node) if node is not None else None
    assert tier is not None and float(total.split()[-1]) == tier.node.mem_total
    assert not [ln for ln in lines if ln.startswith(("pycxl_node_memory_total", "pycxl_node_numa"))]


@pytest.mark.kernel(topology="two-dev")
def test_bad_input_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    p = pycxl_cli("testbed", "--inject", "memory-module", "--set", "no-such-field=1")
    assert p.returncode == 2 and "no-such-field" in p.stderr
    p = pycxl_cli("check", "--expect", "cxl0=lots")
    assert p.returncode == 2 and "cxl0=lots" in p.stderr
    p = pycxl_cli("check", "--textfile", "/nonexistent/dir/x.prom")
    assert p.returncode == 2 and "does not exist" in p.stderr
    p = pycxl_cli("stat", "0")
    assert p.returncode == 2 and "above 0" in p.stderr
    p = _as_nobody("monitor", "--count", "1")
    assert p.returncode == 3 and "root" in p.stderr
    # without root, check still reports what sysfs shows, and says what it skipped
    p = _as_nobody("check", "--json")
    doc = json.loads(p.stdout)
    assert any(f["check"] == "health" and "root" in f["message"] for f in doc["findings"])
    assert p.returncode in (0, CHECK_WARNING), p.stderr
    # a missing expected node is a failure of the check, not a usage error
    p = pycxl_cli("check", "--expect", "cxl3=1G", "--no-health")
    assert p.returncode == CHECK_FAILURE and "cxl3" in p.stdout
