"""Prometheus' node_exporter, run for a test: its textfile collector on a directory,
on a free port of this machine; the metrics it serves, as lines."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request


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
    proc = subprocess.Popen([exporter, "--collector.disable-defaults", "--collector.textfile",
                             *(f"--collector.{c}" for c in collectors),
                             f"--collector.textfile.directory={textfile_dir}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return r.read().decode().splitlines()
            except OSError:
                time.sleep(0.1)
        raise AssertionError("node_exporter did not answer on its port")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
