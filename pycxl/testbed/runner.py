"""Boot the testbed kernel under QEMU with an emulated CXL topology and run a command.

The guest sees the host's file system read-only (virtme-ng), so the installed pycxl,
Python and ndctl are the host's. A per-run work directory is shared read-write.

An emulator crash (QEMU itself stopping while the guest touches CXL memory, see the
testbed guide) is told apart from a failing command: the guest always prints its exit
status last, and a boot that ends without it is booted again once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import NotFoundError, TestbedError
from .kernel import INSTALL_HINT, cache_dir, missing_requirements, prepare_kernel, vng_command
from .topologies import DEFAULT_TOPOLOGY, TOPOLOGIES, Topology

log = logging.getLogger("pycxl.testbed")

EXIT_MARKER = "PYCXL-TESTBED-EXIT="
GUEST_MEMORY = "2G"


@dataclass(frozen=True)
class GuestResult:
    returncode: int
    output: str
    boots: int
    workdir: Path


def topology(name: str) -> Topology:
    try:
        return TOPOLOGIES[name]
    except KeyError:
        raise NotFoundError("testbed topology", name, TOPOLOGIES) from None


def check_requirements() -> None:
    missing = missing_requirements()
    if missing:
        raise TestbedError(
            "the testbed cannot boot; missing: " + "; ".join(missing) + f". Install: {INSTALL_HINT}"
        )


def run_in_guest(
    command: str,
    topology_name: str = DEFAULT_TOPOLOGY,
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 1500.0,
    on_output: Callable[[str], None] | None = None,
    workdir: Path | None = None,
) -> GuestResult:
    """Boot once (twice if the emulator crashes) and run ``command`` with sh in the guest."""
    topo = topology(topology_name)
    check_requirements()
    kernel = prepare_kernel()
    if workdir is None:
        runs = cache_dir() / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=f"{topo.name}-", dir=runs))
    script = workdir / "run.sh"
    guest_env = {
        "PYCXL_EXPECT_MEMDEVS": str(len(topo.serials)),
        "PYCXL_GUEST_CWD": cwd or os.getcwd(),
        "PYCXL_GUEST_COMMAND": command,
        "PYCXL_TESTBED_TOPOLOGY": topo.name,
        "PYCXL_TESTBED_WORKDIR": str(workdir),
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        **(env or {}),
    }
    guest_sh = resources.files("pycxl.testbed").joinpath("guest.sh")
    lines = [f"export {k}={shlex.quote(v)}" for k, v in guest_env.items()]
    lines.append(f". {shlex.quote(str(guest_sh))}")
    script.write_text("\n".join(lines) + "\n")
    vng = vng_command()
    assert vng is not None  # check_requirements() ensured it
    argv = [
        vng, "--run", str(kernel.image), "--disable-microvm", "--disable-kvm",
        "-m", GUEST_MEMORY, "--numa", f"{GUEST_MEMORY},cpus=0-1", "-p", "2",
        "-a", "memhp_default_state=offline",
        "--qemu-opts=" + " ".join(topo.qemu_args()),
        "--rwdir", str(workdir),
        "--exec", f"sh {shlex.quote(str(script))}",
    ]  # fmt: skip
    for boot in (1, 2):
        rc, output = _boot(argv, timeout, on_output)
        if rc is not None:
            return GuestResult(returncode=rc, output=output, boots=boot, workdir=workdir)
        log.warning(
            "the emulator stopped before the guest reported its exit status "
            "(a known QEMU crash under CXL load); booting again"
            if boot == 1
            else "the emulator stopped again without the guest's exit status"
        )
    tail = output[-2000:]
    raise TestbedError(f"the testbed emulator crashed twice in a row; last output:\n{tail}")


def _boot(
    argv: list[str], timeout: float, on_output: Callable[[str], None] | None
) -> tuple[int | None, str]:
    """Run one boot; returns (guest exit status or None if it never came, output)."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    timer = threading.Timer(timeout, _kill_group, args=(proc,))
    timer.start()
    guest_rc: int | None = None
    out: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(EXIT_MARKER):
                guest_rc = int(line[len(EXIT_MARKER) :].strip() or "1")
                continue
            out.append(line)
            if on_output:
                on_output(line)
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:  # interrupted: never leave an emulator running
            _kill_group(proc)
            proc.wait()
    text = "".join(out)
    if guest_rc is None:
        if proc.returncode in (-signal.SIGKILL, -signal.SIGTERM):
            raise TestbedError(f"the testbed guest did not finish within {timeout:.0f} s")
        if "vng: error" in text or "virtme-run: error" in text:
            raise TestbedError(f"virtme-ng refused to start the guest: {text.strip()[-1000:]}")
    return guest_rc, text


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
