"""Boot the testbed kernel under QEMU with an emulated CXL topology and run a command.

The guest sees the host's file system read-only (virtme-ng), so the installed pycxl,
Python and ndctl are the host's. A per-run work directory is shared read-write, and the
guest writes the command's output and exit status there (see guest.sh): the host reads
them from that directory, whatever channel virtme-ng had for the guest's console.

What went wrong is told apart: the guest never started the command (a boot problem,
reported with virtme-ng's output); it started but the emulator stopped before the exit
status was written (a QEMU crash where the guest touches CXL memory); it made no progress
for ``timeout`` seconds of the emulator's CPU time (a stuck guest; the wall clock backs it
up). The last two end the boot and boot again: a command that records its units of work
(progress.py; the kernel tests do) resumes where the stopped boot left off. The limit
follows progress, and counts the emulator's own CPU time, so a guest on a busy host that
runs several times as slowly still finishes; boots stop when BOOTS of them in a row finish
nothing new.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..base._log import get_logger
from ..base.errors import NotAvailableError, NotFoundError, TestbedError
from . import progress
from .clock import ProgressClock, group_alive
from .inject import serve_requests
from .kernel import INSTALL_HINT, cache_dir, missing_requirements, prepare_kernel, vng_command
from .topologies import DEFAULT_TOPOLOGY, TOPOLOGIES, Topology

# Every vCPU on one emulator thread. With a thread per vCPU (QEMU's default for TCG), a
# guest on a host whose cores are busy with other work crawls (likely a vCPU descheduled
# while it holds a guest lock the other spins on). Measured on a 2-core host beside one
# busy-looping process: `import torch` in the guest took 517 s with a thread per vCPU and
# 62 s with one thread; on the idle host, 58 s and 55 s.
SINGLE_THREADED_TCG = ("-accel", "tcg,thread=single")

log = get_logger("pycxl.testbed")

EXIT_MARKER = "PYCXL-TESTBED-EXIT="
POLL_S = 0.2  # how often the host looks at the guest's output file
END_WAIT_S = 30.0  # for a killed boot's processes to be gone
CLOCK_EVERY = 5  # polls between readings of the emulator's CPU time (it scans /proc)
BOOTS = 3  # boots cut short in a row, finishing nothing new, before giving up


@dataclass(frozen=True)
class GuestResult:
    returncode: int
    output: str
    boots: int
    workdir: Path


def topology(name: str) -> Topology:
    """A topology by name; NotFoundError lists them."""
    try:
        return TOPOLOGIES[name]
    except KeyError:
        raise NotFoundError("testbed topology", name, TOPOLOGIES) from None


def check_requirements() -> None:
    """NotAvailableError naming what the testbed cannot boot without."""
    missing = missing_requirements()
    if missing:
        raise NotAvailableError(
            "the testbed cannot boot; missing: " + "; ".join(missing) + f". Install: {INSTALL_HINT}"
        )


def vng_environment(vng: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment virtme-ng starts in: ``environ`` (default: this process's) with
    vng's folder first on PATH, since vng starts virtme-run by name. An environment that
    is not activated (the tests' .venv, run as .venv/bin/python) is not on PATH."""
    env = dict(os.environ if environ is None else environ)
    first = os.path.dirname(vng)
    rest = [d for d in env.get("PATH", os.defpath).split(os.pathsep) if d and d != first]
    env["PATH"] = os.pathsep.join([first, *rest])
    return env


def new_workdir(topology_name: str) -> Path:
    """A fresh run directory, shared with the guest (its output, status and reports)."""
    runs = cache_dir() / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{topology_name}-", dir=runs))


def guest_environment(
    topology_name: str,
    memdevs: int,
    command: str,
    workdir: Path,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """What the guest's script exports before it runs ``command``."""
    return {
        "PYCXL_EXPECT_MEMDEVS": str(memdevs),
        "PYCXL_GUEST_CWD": cwd or os.getcwd(),
        "PYCXL_GUEST_COMMAND": command,
        "PYCXL_TESTBED_TOPOLOGY": topology_name,
        "PYCXL_TESTBED_WORKDIR": str(workdir),
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        # QEMU 10.0 (TCG) segfaults when an FXSAVE/XSAVE area spans a RAM page and a
        # CXL page above it (docs/testbed.md). ld.so's lazy binding saves the FPU
        # state on the stack, and stacks of programs under a DRAM+CXL interleave mix
        # the two; binding every symbol at start-up takes that save away.
        "LD_BIND_NOW": "1",
        **(env or {}),
    }


def run_in_guest(
    command: str,
    topology_name: str = DEFAULT_TOPOLOGY,
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = progress.STALL_TIMEOUT_S,
    boot_timeout: float = progress.BOOT_TIMEOUT_S,
    on_output: Callable[[str], None] | None = None,
    workdir: Path | None = None,
    stop: threading.Event | None = None,
) -> GuestResult:
    """Boot and run ``command`` with sh in the guest; boot again when a boot is cut short.

    ``timeout``: seconds of emulator CPU time the running command may go without progress
    (new output, or a unit of work recorded in the work directory) before the boot is
    ended as stuck; ``boot_timeout``: the same, for the guest to reach the command. The
    wall clock ends a boot at three times either (a guest that uses no CPU: clock.py).
    ``stop``, once set (from another thread), ends the boot and raises TestbedError: the
    emulator never outlives the caller that no longer waits for it."""
    topo = topology(topology_name)
    check_requirements()
    kernel = prepare_kernel()
    workdir = workdir or new_workdir(topo.name)
    script = workdir / "run.sh"
    guest_env = guest_environment(topo.name, len(topo.serials), command, workdir, cwd, env)
    guest_sh = resources.files("pycxl.testbed").joinpath("guest.sh")
    lines = [f"export {k}={shlex.quote(v)}" for k, v in guest_env.items()]
    lines.append(f". {shlex.quote(str(guest_sh))}")
    script.write_text("\n".join(lines) + "\n")
    vng = vng_command()
    assert vng is not None  # check_requirements() ensured it
    qmp = str(workdir / "qmp.sock")  # fault injection (inject.py) goes through it
    argv = [
        vng, "--run", str(kernel.image), "--disable-microvm", "--disable-kvm",
        *topo.vng_args(), "-a", "memhp_default_state=offline",
        "--qemu-opts=" + " ".join([*topo.qemu_args(), *SINGLE_THREADED_TCG, "-qmp",
                                   f"unix:{qmp},server=on,wait=off"]),
        "--rwdir", str(workdir),
        "--exec", f"sh {shlex.quote(str(script))}",
    ]  # fmt: skip
    ids = {sn: topo.device_id(sn) for sn in topo.serials}
    limits = _Limits(boot=boot_timeout, stall=timeout)
    boot = in_a_row = 0
    while True:
        boot += 1
        done_before = progress.finished(workdir)
        outcome = _boot(argv, _GuestFiles(workdir), limits, on_output, env=vng_environment(vng),
                        serve=lambda: serve_requests(workdir, qmp, ids), stop=stop)  # fmt: skip
        if outcome.returncode is not None:
            return GuestResult(outcome.returncode, outcome.output, boot, workdir)
        if not outcome.started:
            raise TestbedError(
                f"the testbed guest never started the command ({outcome.stopped}); "
                f"virtme-ng exit {outcome.vng_returncode}, its output:\n{outcome.vng_tail}"
            )
        # keep the stopped boot's files for a post-mortem: the next boot starts afresh
        for name in ("output", "vng.log"):
            if (workdir / name).exists():
                (workdir / name).replace(workdir / f"{name}.boot{boot}")
        progress.note_stop(workdir, boot, outcome.stopped)
        new = len(progress.finished(workdir) - done_before)
        in_a_row = 0 if new else in_a_row + 1
        log.warning(
            "testbed boot %d ended before the command did: %s; it finished %d new unit(s)%s",
            boot,
            outcome.stopped,
            new,
            "; booting again, resuming" if in_a_row < BOOTS else "",
        )
        if in_a_row >= BOOTS:
            raise TestbedError(
                f"the testbed guest stopped {BOOTS} boots in a row without finishing anything "
                f"new ({progress.stop_reasons(workdir, list(range(boot - BOOTS + 1, boot + 1)))}; "
                f"virtme-ng exit {outcome.vng_returncode}); the command's last output:\n"
                f"{outcome.output[-2000:]}"
            )


@dataclass(frozen=True)
class _Limits:
    boot: float  # seconds to reach the command
    stall: float  # seconds without progress once the command runs


@dataclass
class _GuestFiles:
    """What the guest writes into the shared work directory (guest.sh)."""

    workdir: Path

    def reset(self) -> None:
        for name in ("started", "output", "exit-status", "exit-status.new", "vng.log"):
            (self.workdir / name).unlink(missing_ok=True)

    def progress_mark(self) -> tuple[int, int]:
        """Changes whenever the command shows progress: output, units recorded."""
        sizes = []
        for path in (self.output, self.workdir / progress.REPORT):
            try:
                sizes.append(path.stat().st_size)
            except FileNotFoundError:
                sizes.append(0)
        return sizes[0], sizes[1]

    @property
    def started(self) -> bool:
        return (self.workdir / "started").exists()

    @property
    def output(self) -> Path:
        return self.workdir / "output"

    @property
    def vng_log(self) -> Path:
        return self.workdir / "vng.log"

    def exit_status(self) -> int | None:
        try:
            text = (self.workdir / "exit-status").read_text().strip()
        except FileNotFoundError:
            return None
        return int(text) if text.isdecimal() else None


@dataclass(frozen=True)
class _Outcome:
    returncode: int | None  # the command's exit status; None if it never arrived
    started: bool  # the guest reached the command
    stopped: str  # why the boot ended before the exit status came, in words
    output: str  # the command's output
    vng_returncode: int
    vng_tail: str  # virtme-ng's own output (boot errors), last lines


def _boot(
    argv: list[str],
    files: _GuestFiles,
    limits: _Limits,
    on_output: Callable[[str], None] | None,
    serve: Callable[[], None] | None = None,
    env: Mapping[str, str] | None = None,
    stop: threading.Event | None = None,
) -> _Outcome:
    """Run one boot, following the command's output file as it grows, until the guest
    ends, its device breaks, or it runs out of time: ``limits.boot`` to reach the command,
    then ``limits.stall`` from its last sign of progress, both in the emulator's CPU
    time, with the wall clock as a backstop (clock.py)."""
    files.reset()
    with files.vng_log.open("wb") as vng_log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=vng_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    follower = _Follower(files.output, on_output)
    stopped = (
        "the emulator stopped before the command ended (QEMU crashed, or the guest powered off)"
    )
    mark, started = files.progress_mark(), False
    clock = ProgressClock(proc.pid, limits.boot)  # the group: start_new_session above
    polls = 0
    try:
        with _signals_end_the_boot():
            while proc.poll() is None:
                if not started and files.started:
                    started = True
                    clock = ProgressClock(proc.pid, limits.stall)
                elif started and files.progress_mark() != mark:
                    mark = files.progress_mark()
                    clock.progress()
                polls += 1
                late = clock.expired() if polls % CLOCK_EVERY == 0 else None
                if late is not None:
                    stopped = (
                        f"no progress for {late} (no output, no test started or finished)"
                        if started
                        else f"the guest did not reach the command within {late}"
                    )
                    _end(proc)
                    break
                follower.poll()
                if serve is not None:
                    serve()  # the guest's injection requests, through QMP
                if stop is not None and stop.is_set():
                    break
                broken = _device_broken(files.vng_log)
                if broken:
                    stopped = f"QEMU stopped the guest's virtio device ({broken})"
                    _end(proc)  # the guest's disk I/O hangs from here: do not wait
                    break
                time.sleep(POLL_S)
    finally:
        if proc.poll() is None:  # interrupted: never leave an emulator running
            _end(proc)
    if stop is not None and stop.is_set():
        raise TestbedError("the boot was stopped before the command ended: its caller gave up")
    follower.poll(final=True)
    vng_text = files.vng_log.read_text(errors="replace")
    rc = files.exit_status()
    if rc is None:
        rc = _marker_status(vng_text)  # the exit line on virtme-ng's output, if it came
    if rc is None and ("vng: error" in vng_text or "virtme-run: error" in vng_text):
        raise TestbedError(f"virtme-ng refused to start the guest: {vng_text.strip()[-1000:]}")
    if rc is not None and _marker_status(vng_text) is None:
        log.info(
            "the guest had no script I/O ports (no udev on the host?); "
            "its output and exit status came through the shared work directory"
        )
    return _Outcome(
        returncode=rc,
        started=files.started,
        stopped=stopped,
        output=follower.text,
        vng_returncode=proc.returncode,
        vng_tail=vng_text.strip()[-2000:] or "(nothing)",
    )


@contextlib.contextmanager
def _signals_end_the_boot() -> Iterator[None]:
    """SIGTERM and SIGHUP (a cancelled CI job, a closed terminal) end the boot through its
    clean-up, so that no emulator is left running: by default they end Python without
    running ``finally`` blocks. Only in the main thread, and only where the program set
    no handler of its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    taken = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) == signal.SIG_DFL]

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    for s in taken:
        signal.signal(s, stop)
    try:
        yield
    finally:
        for s in taken:
            signal.signal(s, signal.SIG_DFL)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """The boot's whole process group killed and gone: SIGKILL takes a process only when
    it leaves the kernel, which on a busy host can come after its parent was reaped."""
    _kill_group(proc)
    proc.wait()
    deadline = time.monotonic() + END_WAIT_S
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


# QEMU's messages when it stops a virtio device for good; the guest then hangs on I/O
FATAL_DEVICE_ERRORS = ("virtio: bogus descriptor", "virtio: zero sized buffers")


def _device_broken(vng_log: Path) -> str | None:
    """QEMU's message if it stopped a virtio device for good."""
    try:
        text = vng_log.read_text(errors="replace")
    except FileNotFoundError:
        return None
    return next((e for e in FATAL_DEVICE_ERRORS if e in text), None)


def _marker_status(text: str) -> int | None:
    for line in reversed(text.splitlines()):
        if line.startswith(EXIT_MARKER):
            value = line[len(EXIT_MARKER) :].strip()
            return int(value) if value.isdecimal() else None
    return None


class _Follower:
    """Reads a file that another machine appends to, passing on whole lines."""

    def __init__(self, path: Path, on_line: Callable[[str], None] | None) -> None:
        self.path, self.on_line = path, on_line
        self.offset = 0
        self.pending = b""
        self.chunks: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    def poll(self, final: bool = False) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        self.offset += len(data)
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        if final and self.pending:
            lines, self.pending = [*lines, self.pending], b""
        for raw in lines:
            line = raw.decode(errors="replace") + "\n"
            self.chunks.append(line)
            if self.on_line:
                self.on_line(line)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
