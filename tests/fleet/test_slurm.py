"""A real one-host Slurm cluster (Debian's slurm-wlm 22.05 and munge, started here with
their own configuration, ports and state, stopped at the end) run the way
docs/operations.md says: slurm.conf gets contrib/slurm/slurm.conf.pycxl, the node's line
is ``slurmd -C``'s with ``pycxl labels --format slurm`` after it, and the health check
is contrib/slurm/pycxl-healthcheck. The host's memory is a recorded sysfs tree
(``PYCXL_SYSROOT``), swapped for copies edited to break one thing.

Proven: jobs land by ``--constraint`` and ``--gres`` or are refused; the health check
drains the node with the finding as the reason, a job waits, and the node returns to
service (and runs it) when the check passes again; an administrator's drain stays; the
docs' job-script preamble runs as an sbatch job with the exit codes the docs give.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet import slurm_cluster
from tests.fleet.slurm_cluster import Cluster, wait_for
from tests.fleet.trees import FRESH, REGION, edited_tree

ROOT = Path(__file__).resolve().parents[2]
CONTRIB = ROOT / "contrib" / "slurm"
PYCXL = str(Path(sys.executable).with_name("pycxl"))
OFFLINE_REASON = ("pycxl: failure: region0: 1 of 4 memory blocks of dax0.0 are offline "
                  "[region-online]")  # fmt: skip


def _job_script() -> str:
    """The job-script preamble of docs/operations.md, as written there."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    after = doc.split("<!-- fleet: job script -->", 1)[1]
    block = re.search(r"```sh\n(.*?)```", after, re.S)
    assert block is not None and after.index(block.group(0)) < 5
    return block.group(1)


def _docs_block(command: str) -> list[str]:
    """The output docs/operations.md shows under ``command``."""
    doc = (ROOT / "docs" / "operations.md").read_text().splitlines()
    at = doc.index(command)
    return doc[at + 1 : doc.index("```", at)]


class HealthChecks:
    """The shipped health check, run by slurmd through a wrapper that counts its runs
    (slurmd gives it an empty environment: the wrapper names its settings file, the
    documented way to configure it)."""

    def __init__(self, folder: Path) -> None:
        self.dir = folder
        self.runs = folder / "healthcheck.runs"
        self.tree = folder / "tree"  # a symbolic link: the host's memory now
        self.wrapper = folder / "healthcheck"
        self.settings = folder / "pycxl-healthcheck.conf"

    def install(self, slurm_conf: Path) -> None:
        self.use(REGION)
        self.settings.write_text(f"PYCXL={PYCXL}\nPYCXL_SYSROOT={self.tree}\n"
                                 f"SLURM_CONF={slurm_conf}\n")  # fmt: skip
        self.wrapper.write_text(
            "#!/bin/sh\n"
            f"echo start >> {self.runs}\n"
            f"PYCXL_HEALTHCHECK_CONF={self.settings} {CONTRIB / 'pycxl-healthcheck'}\n"
            f"echo end $? >> {self.runs}\n"
        )
        self.wrapper.chmod(0o755)

    def use(self, tree: Path) -> None:
        """Point the host's memory at ``tree``, atomically (a link renamed over)."""
        tmp = self.dir / "tree.new"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(tree)
        tmp.rename(self.tree)

    def ended(self) -> int:
        text = self.runs.read_text() if self.runs.exists() else ""
        return sum(1 for ln in text.splitlines() if ln.startswith("end"))

    def started(self) -> int:
        text = self.runs.read_text() if self.runs.exists() else ""
        return sum(1 for ln in text.splitlines() if ln.startswith("start"))

    def after_next_run(self, cluster: Cluster) -> None:
        """Return once a run that started after now has ended (it saw what is there
        now, and what it did to the node is done)."""
        first_new = self.started() + 1
        wait_for("a health check run to start and end",
                 lambda: True if self.ended() >= first_new else None,
                 lambda: (self.started(), self.ended(), cluster.progress()))  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, HealthChecks]]:
    lacking = slurm_cluster.missing()
    if lacking:
        if os.environ.get("PYCXL_REQUIRE_TESTBED") == "1":
            pytest.fail(f"not installed: {', '.join(lacking)} (scripts/setup-test-env.sh)")
        pytest.skip(f"not installed: {', '.join(lacking)}")
    if os.geteuid() != 0:  # as the testbed: its daemons run as root, as on a cluster
        pytest.skip("the test cluster's daemons run as root: run the tests as root")
    folder = tmp_path_factory.mktemp("slurm")
    folder.chmod(0o700)
    # the node's line: what slurmd -C finds, then what pycxl labels says of the memory
    hardware = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True)
    name, rest = hardware.stdout.splitlines()[0].split(" ", 1)
    assert name.startswith("NodeName=")
    labels = subprocess.run([PYCXL, "labels", "--format", "slurm", "--sysroot", str(REGION)],
                            capture_output=True, text=True, check=True)  # fmt: skip
    checks = HealthChecks(folder)
    conf = []
    for line in (CONTRIB / "slurm.conf.pycxl").read_text().splitlines():
        if line.startswith("HealthCheckProgram="):
            line = f"HealthCheckProgram={checks.wrapper}"
        elif line.startswith("HealthCheckInterval="):
            line = "HealthCheckInterval=5"
        if line and not line.startswith("#"):
            conf.append(line)
    c = Cluster(folder, f"{rest} {labels.stdout.strip()}", conf)
    checks.install(c.conf)
    try:
        c.start()
        yield c, checks
    finally:
        c.stop()


def test_the_node_has_the_features_pycxl_labels_gives(
    cluster: tuple[Cluster, HealthChecks],
) -> None:
    c, _ = cluster
    node = c.show("node", c.host)
    assert node["AvailableFeatures"] == "cxl,cxl_gib:0,cxl_pinnable", node
    assert node["ActiveFeatures"] == node["AvailableFeatures"]
    assert node["Gres"] == "cxl_mem:512M", node


def test_jobs_land_by_constraint_and_gres_or_are_refused(
    cluster: tuple[Cluster, HealthChecks], tmp_path: Path
) -> None:
    c, _ = cluster
    asks = (["--constraint=cxl"], ["--constraint=cxl&cxl_pinnable"], ["--gres=cxl_mem:256M"],
            ["--gres=cxl_mem:512M", "--constraint=cxl_gib:0"])  # fmt: skip
    for ask in asks:
        out = tmp_path / "job-%j.out"
        p = c.sbatch(*ask, "-o", str(out), "--wrap", "echo landed on $(hostname -s)")
        assert p.returncode == 0, p.stderr
        job = p.stdout.strip()
        rec = c.wait_job(job)
        assert rec["JobState"] == "COMPLETED" and rec["ExitCode"] == "0:0", (ask, rec)
        assert rec["NodeList"] == c.host
        assert (tmp_path / f"job-{job}.out").read_text() == f"landed on {c.host}\n"
    # no node has that much or that feature: refused at submission, never queued
    p = c.sbatch("--gres=cxl_mem:1G", "--wrap", "true")
    assert p.returncode != 0 and "Requested node configuration is not available" in p.stderr
    p = c.sbatch("--constraint=cxl_gib:64", "--wrap", "true")
    assert p.returncode != 0 and "Invalid feature specification" in p.stderr


def test_health_check_drains_with_the_finding_and_returns_the_node(
    cluster: tuple[Cluster, HealthChecks], tmp_path: Path
) -> None:
    c, checks = cluster
    checks.after_next_run(c)
    assert c.state().startswith("idle"), c.state()
    checks.use(edited_tree(tmp_path / "offline", "blocks-offline"))
    checks.after_next_run(c)
    assert "drain" in c.state(), (c.state(), c.reason(), c.logs())
    assert c.reason() == OFFLINE_REASON
    # what docs/operations.md shows, for a host named vm
    shown = _docs_block("$ sinfo -N -o '%N %T %E'")
    p = c.run("sinfo", "-N", "-o", "%N %T %E")
    assert p.stdout.replace(c.host, "vm", 1).splitlines() == shown, p.stdout
    # a job that needs CXL memory waits while the node is drained
    p = c.sbatch("--constraint=cxl", "-o", str(tmp_path / "waited.out"), "--wrap", "echo ran")
    assert p.returncode == 0, p.stderr
    job = p.stdout.strip()
    wait_for(f"job {job} to be considered", lambda: True if c.show("job", job).get("Reason")
             not in ("None", "", None) else None, c.progress)  # fmt: skip
    checks.after_next_run(c)  # still broken: still drained, still pending
    assert c.reason() == OFFLINE_REASON and c.job_state(job) == "PENDING"
    checks.use(REGION)
    checks.after_next_run(c)
    assert "drain" not in c.state(), (c.state(), c.reason())
    rec = c.wait_job(job)
    assert rec["JobState"] == "COMPLETED" and (tmp_path / "waited.out").read_text() == "ran\n"


def test_an_administrators_drain_is_left_alone(cluster: tuple[Cluster, HealthChecks]) -> None:
    c, checks = cluster
    p = c.run("scontrol", "update", f"nodename={c.host}", "state=drain", "reason=maintenance")
    assert p.returncode == 0, p.stderr
    try:
        checks.after_next_run(c)  # the check passes, but pycxl did not drain it
        assert "drain" in c.state() and c.reason() == "maintenance"
    finally:
        c.run("scontrol", "update", f"nodename={c.host}", "state=resume")
    assert "drain" not in c.state()


@pytest.mark.parametrize(("tree", "state", "code"), [
    (REGION, "COMPLETED", "0:0"),  # cxl0 with its 512 MiB, one region: the job runs
    (FRESH, "FAILED", "1:0"),  # no region, no cxl0: the job stops before it starts
])  # fmt: skip
def test_the_docs_job_preamble_runs_as_an_sbatch_job(
    cluster: tuple[Cluster, HealthChecks], tmp_path: Path, tree: Path, state: str, code: str
) -> None:
    c, _ = cluster
    script = tmp_path / "job.sh"
    script.write_text(_job_script())
    env = {"PYCXL_SYSROOT": str(tree), "PATH": f"{Path(PYCXL).parent}:{os.environ['PATH']}"}
    p = c.sbatch("-o", str(tmp_path / "out"), "-e", str(tmp_path / "err"), str(script),
                 "sh", "-c", "echo the job ran", **env)  # fmt: skip
    assert p.returncode == 0, p.stderr
    rec = c.wait_job(p.stdout.strip())
    out, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert (rec["JobState"], rec["ExitCode"]) == (state, code), (rec, out, err)
    if state == "COMPLETED":
        assert out == "pycxl check: ok (8 ok, 0 info, 0 warning, 0 failure)\nthe job ran\n"
        assert err == ""
    else:
        assert "the job ran" not in out
        assert "pycxl check: failure" in out and "cxl0 is expected with 512.00 MiB" in out
        assert err == "host memory not usable for this job\n"
