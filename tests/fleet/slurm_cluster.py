"""A one-host Slurm cluster for a test: Debian's munge, slurmctld and slurmd, run as root
with their own key, socket, configuration, ports and state folder (nothing outside that
folder is touched), stopped at the end even when the test fails or its process dies.

Waiting is on state, never on a fixed sleep: each wait names what shows progress (a
daemon's log growing, a health check run ending, a job changing state) and fails only
when nothing has moved for a long while, so a busy machine slows a test down without
failing it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "sinfo", "squeue", "scancel")
STALL_S = 300.0  # nothing moved for this long: give up
LIMIT_S = 1800.0  # and never wait longer than this in all
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def missing() -> list[str]:
    """The Slurm and munge programs this machine lacks."""
    return [p for p in (*DAEMONS, *CLIENTS) if shutil.which(p) is None]


def wait_for(what: str, done: Callable[[], T | None], progress: Callable[[], object],
             stall_s: float = STALL_S, limit_s: float = LIMIT_S) -> T:  # fmt: skip
    """Poll ``done`` until it returns something; fail when ``progress()`` has not
    changed for ``stall_s`` seconds (or after ``limit_s`` in all)."""
    start = last_move = time.monotonic()
    seen = progress()
    pause = 0.05
    while True:
        result = done()
        if result is not None:
            return result
        now = time.monotonic()
        moved = progress()
        if moved != seen:
            seen, last_move = moved, now
        if now - last_move > stall_s or now - start > limit_s:
            raise AssertionError(
                f"waited {now - start:.0f} s for {what}; nothing moved for "
                f"{now - last_move:.0f} s (last progress: {seen!r})"
            )
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: SIGTERM when the test process goes away (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


class Cluster:
    """munged, slurmctld and slurmd in ``folder``, for the node this host is. ``node``:
    the rest of the NodeName= line after the name (CPUs, memory, Features=, Gres=);
    ``conf``: further slurm.conf lines."""

    def __init__(self, folder: Path, node: str, conf: Iterable[str] = ()) -> None:
        self.dir = folder
        self.host = socket.gethostname().split(".")[0]
        self.node_line = node
        self.extra = list(conf)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.conf = folder / "slurm.conf"

    # --- life ---------------------------------------------------------------------------
    def write_conf(self) -> None:
        d = self.dir
        for sub in ("state", "spool", "log"):
            (d / sub).mkdir(exist_ok=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        lines = [
            "ClusterName=pycxltest",
            f"SlurmctldHost={self.host}",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log",
            f"SlurmdLogFile={d}/log/slurmd.log",
            "AuthType=auth/munge",
            f"AuthInfo=socket={d}/munge.sock",
            "CredType=cred/munge",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "MinJobAge=3600",  # finished jobs stay visible to scontrol for an hour
            *self.extra,
            f"NodeName={self.host} {self.node_line}",
            "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def _start(self, *argv: str) -> None:
        log = open(self.dir / "log" / f"{Path(argv[0]).name}.out", "wb")  # noqa: SIM115
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                           env=self.env(), cwd=self.dir,
                                           preexec_fn=_die_with_parent))  # fmt: skip
        log.close()

    def start(self) -> None:
        """Start the three daemons; return when the node is idle (or fail saying why)."""
        self.write_conf()
        d = self.dir
        self._start("munged", "-F", "-f", f"--key-file={d}/munge.key",
                    f"--socket={d}/munge.sock", f"--log-file={d}/munged.log",
                    f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed")  # fmt: skip
        wait_for("munged's socket", lambda: True if (d / "munge.sock").exists() else None,
                 self.progress)  # fmt: skip
        self._start("slurmctld", "-D", "-i")
        self._start("slurmd", "-D")
        wait_for(f"node {self.host} to come up idle",
                 lambda: True if self.state().startswith("idle") else None,
                 self.progress)  # fmt: skip

    def stop(self) -> None:
        """Stop what this cluster started, newest first; nothing is left running."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()

    def alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(
                    f"{proc.args[0]} exited with {proc.returncode}: " + self.logs()
                )

    # --- what it says ---------------------------------------------------------------------
    def progress(self) -> tuple[int, ...]:
        """Sizes of the daemons' logs: they grow while the daemons work."""
        self.alive()
        logs = [*sorted((self.dir / "log").glob("*")), self.dir / "munged.log"]
        return tuple(p.stat().st_size if p.exists() else -1 for p in logs)

    def logs(self, lines: int = 15) -> str:
        out = []
        for p in sorted((self.dir / "log").glob("*.log")):
            out.append(f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-lines:]))
        return "\n".join(out)

    def run(self, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, env=self.env(**env),
                              timeout=300, check=False)  # fmt: skip

    def state(self) -> str:
        """The node's state as sinfo says it (idle, drained, allocated, ...)."""
        p = self.run("sinfo", "-h", "-N", "-n", self.host, "-o", "%T")
        return p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else ""

    def reason(self) -> str:
        p = self.run("sinfo", "-h", "-N", "-n", self.host, "-o", "%E")
        return p.stdout.strip().splitlines()[0] if p.stdout.strip() else ""

    def show(self, kind: str, name: str) -> dict[str, str]:
        """``scontrol -o show node|job NAME`` as key -> value (the last key's value may
        hold spaces: Reason= is last for nodes)."""
        p = self.run("scontrol", "-o", "show", kind, name)
        assert p.returncode == 0, p.stderr
        out: dict[str, str] = {}
        key = None
        for word in p.stdout.strip().split(" "):
            k, eq, v = word.partition("=")
            if eq and k and k[0].isupper():
                key = k
                out[key] = v
            elif key is not None:
                out[key] += " " + word
        return out

    def sbatch(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return self.run("sbatch", "--parsable", *args, **env)

    def job_state(self, job: str) -> str:
        return self.show("job", job).get("JobState", "")

    def wait_job(self, job: str, states: tuple[str, ...] = FINISHED) -> dict[str, str]:
        """The job's record once it reaches one of ``states``."""

        def reached() -> dict[str, str] | None:
            rec = self.show("job", job)
            return rec if rec.get("JobState") in states else None

        return wait_for(f"job {job} to reach {'/'.join(states)}", reached,
                        lambda: (self.job_state(job), self.progress()))  # fmt: skip
