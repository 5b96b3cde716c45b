"""Prometheus' node_exporter, run for a test: its textfile collector on a directory,
on a free port of this machine; the metrics it serves, as lines."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

STARTUP_LIMIT_S = 300.0


def binary() -> str | None:
    """The exporter Debian installs (prometheus-node-exporter), or upstream's name."""
    return shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(textfile_dir: str, exporter: str, *collectors: str) -> list[str]:
    """Start the exporter with only the textfile collector on ``textfile_dir`` (and
    ``collectors``: 'meminfo_numa'...), read /metrics once, stop it; the lines it served
    (AssertionError if it never answered)."""
    port = _free_port()
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen([exporter, "--collector.disable-defaults", "--collector.textfile",
                             *(f"--collector.{c}" for c in collectors),
                             f"--collector.textfile.directory={textfile_dir}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip
    try:
        # until it answers or exits: a busy machine only makes it slower to start
        deadline = time.monotonic() + STARTUP_LIMIT_S
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
                    return r.read().decode().splitlines()
            except OSError:
                time.sleep(0.1)
        log.seek(0)
        said = log.read().decode(errors="replace")[-2000:]
        raise AssertionError(f"node_exporter did not answer on its port (exit {proc.poll()}): "
                             f"{said}")  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
