"""The files under contrib/ that the docs tell operators to copy: the cron lines run as
cron would run them (with their folders moved into a temporary one, on a recorded
tree), and their files read back by node_exporter and by node-feature-discovery's rules;
the health check is valid POSIX shell."""

from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import node_exporter
from tests.fleet import alerting, nfd_format
from tests.fleet.trees import FRESH, REGION, edited_tree

ROOT = Path(__file__).resolve().parents[2]
CRON = ROOT / "contrib" / "cron.d" / "pycxl"
TEXTFILES = "/var/lib/prometheus/node-exporter"
FEATURES = "/etc/kubernetes/node-feature-discovery/features.d"


def test_the_cron_lines_write_what_the_readers_take(tmp_path: Path) -> None:
    text = CRON.read_text()
    path = re.search(r"^PATH=(.*)$", text, re.M)
    assert path is not None
    jobs = re.findall(r"^\* \* \* \* \* root (.*)$", text, re.M)
    assert len(jobs) == 3
    textfiles, features = tmp_path / "textfiles", tmp_path / "features.d"
    textfiles.mkdir()
    # cron's environment: its PATH, with the pycxl under test first
    env = {"PATH": f"{Path(sys.executable).parent}:{path.group(1)}",
           "PYCXL_SYSROOT": str(REGION), "HOME": str(tmp_path)}  # fmt: skip
    for job in jobs:
        job = job.replace(TEXTFILES, str(textfiles)).replace(FEATURES, str(features))
        p = subprocess.run(["sh", "-c", job], capture_output=True, text=True, env=env,
                           check=False)  # fmt: skip
        assert p.returncode == 0 and p.stderr == "", (job, p.stderr)
    assert sorted(p.name for p in textfiles.iterdir()) == ["pycxl-check.prom", "pycxl-stat.prom"]
    exporter = node_exporter.binary()
    if exporter is None:
        pytest.skip("prometheus-node-exporter is not installed")
    series = alerting.samples(node_exporter.scrape(str(textfiles), exporter), prefix="")
    assert series["node_textfile_scrape_error"] == 0
    assert series["pycxl_check_status"] == 0
    assert series['pycxl_node_info{node="1",target="cxl0",tier="cxl"}'] == 1
    labels, errors = nfd_format.read(features / "pycxl", datetime.datetime.now(datetime.UTC))
    assert errors == [] and labels["feature.node.kubernetes.io/memory-tier.cxl"] == "true"
    assert [pr for k, v in labels.items() for pr in nfd_format.label_problems(k, v)] == []


@pytest.mark.parametrize(("tree", "code", "line"), [
    ("region", 0, "ok: 6 ok, 0 info, 0 warning, 0 failure"),
    ("fresh", 6, "warning: mem0's 256.00 MiB is in no region: the host cannot use it "
                 "[memdev-in-region] (+1 more)"),
    ("memdev-disabled", 7, "failure: mem1 is disabled: its driver is not bound [memdev-enabled]"),
    ("region-uncommitted", 7, "failure: region0 is not committed: its decoders do not route "
                              "memory [region-committed]"),
])  # fmt: skip
def test_check_oneline_gives_the_worst_finding_for_a_drain_reason(
    tmp_path: Path, tree: str, code: int, line: str
) -> None:
    root = {"region": REGION, "fresh": FRESH}.get(tree) or edited_tree(tmp_path / tree, tree)
    p = subprocess.run([sys.executable, "-m", "pycxl.cli.main", "check", "--oneline", "--sysroot",
                        str(root)], capture_output=True, text=True, check=False)  # fmt: skip
    assert (p.returncode, p.stdout, p.stderr) == (code, line + "\n", "")
    p = subprocess.run([sys.executable, "-m", "pycxl.cli.main", "check", "--oneline", "--json"],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert p.returncode == 2 and "give --json or --oneline, not both" in p.stderr


def test_the_health_check_is_portable_shell() -> None:
    """ShellCheck finds nothing in it as POSIX sh (slurmd runs it with /bin/sh)."""
    script = ROOT / "contrib" / "slurm" / "pycxl-healthcheck"
    assert os.access(script, os.X_OK)
    assert script.read_text().startswith("#!/bin/sh\n")
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        if os.environ.get("PYCXL_REQUIRE_TESTBED") == "1":
            pytest.fail("shellcheck is not installed (scripts/setup-test-env.sh)")
        pytest.skip("shellcheck is not installed")
    p = subprocess.run([shellcheck, "--shell=sh", str(script)], capture_output=True, text=True,
                       check=False)  # fmt: skip
    assert p.returncode == 0, p.stdout
