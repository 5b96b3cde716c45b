"""Signals and pipes, with real signals to real pycxl processes: a signal that ends a
program ends pycxl after its clean-up (the kernel left as it was, top's command ended),
by that same signal (a shell reports 128+n); a reader that goes away ends every command
as SIGPIPE ends ndctl's cxl list (141, nothing said)."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pycxl.cli.main import COMMANDS

from pycxl.numa.placement import NumaBuffer
from pycxl.numa.policy import Policy

ROOT = Path(__file__).resolve().parents[2]
TREES = ROOT / "tests" / "data" / "trees"
REGION = str(TREES / "two-dev" / "region")
PMEM = str(TREES / "pmem-dev" / "fresh")
PROMPT_S = 3.0  # from the signal to pycxl's exit, on a busy small host
PYCXL = [sys.executable, "-m", "pycxl.cli.main"]


def _default_signals() -> None:
    """As a terminal's foreground job has them (a shell running tests in the background
    ignores SIGINT and SIGQUIT, nohup ignores SIGHUP, and pycxl keeps an ignored signal
    ignored)."""
    for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


# --- monitor: tracefs and the trace instance as they were --------------------------------
MONITOR_UNDER_SIGNAL = """
import json, os, signal, subprocess, sys
sig = int(sys.argv[1])
def tracefs():
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[2] == "tracefs"]
for path in tracefs():  # this private mount namespace starts with tracefs unmounted
    subprocess.run(["umount", path], check=True)
def dfl():
    for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
p = subprocess.Popen([sys.executable, "-m", "pycxl.cli.main", "monitor"], stdout=subprocess.DEVNULL,
                     stderr=subprocess.PIPE, text=True, preexec_fn=dfl)
err = []
for line in p.stderr:
    err.append(line)
    if "monitoring" in line:
        break
instance = f"pycxl-{p.pid}-0"
during = tracefs()
had = os.path.isdir(f"/sys/kernel/tracing/instances/{instance}")
p.send_signal(sig)
err += p.stderr.readlines()
rc = p.wait(timeout=10)
after = tracefs()
if not after:  # mounted again to look for the instance
    subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=True)
left = os.path.isdir(f"/sys/kernel/tracing/instances/{instance}")
print(json.dumps({"rc": rc, "during": during, "had": had, "after": after, "left": left,
                  "err": "".join(err)}))
"""


def _monitor_ends_by(sig: int) -> dict[str, object]:
    """pycxl monitor, in a mount namespace of its own where tracefs is not mounted (other
    users of this host may mount it), signalled once it listens."""
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                        MONITOR_UNDER_SIGNAL, str(sig)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    out: dict[str, object] = json.loads(p.stdout)
    return out


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="mounts tracefs: needs root and unshare")  # fmt: skip
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM, signal.SIGINT])
def test_monitor_ended_by_a_signal_leaves_tracing_as_it_was(sig: signal.Signals) -> None:
    if not Path("/sys/kernel/tracing").is_dir():
        pytest.skip("this kernel has no tracefs mount point")
    r = _monitor_ends_by(sig)
    assert r["during"] == ["/sys/kernel/tracing"] and r["had"], r  # it did set them up
    assert r["after"] == [] and not r["left"], r  # unmounted, the instance removed
    assert r["rc"] == -sig, r  # ended by the signal: a shell says 128+n
    assert "Traceback" not in str(r["err"]), r["err"]
    said = str(r["err"]).strip().splitlines()[-1]
    assert (said == "pycxl: interrupted") == (sig == signal.SIGINT), r["err"]


TRACE_SETUP_SIGNALLED = """
import os, signal, subprocess
from pycxl.base import trace
def tracefs():
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[2] == "tracefs"]
for path in tracefs():
    subprocess.run(["umount", path], check=True)
class Stop(BaseException):
    pass
def stop(signum, frame):
    raise Stop
signal.signal(signal.SIGTERM, stop)
mount = trace._mount_tracefs
def mount_then_signalled(fs):
    path = mount(fs)
    os.kill(os.getpid(), signal.SIGTERM)  # the moment after the mount
    return path
trace._mount_tracefs = mount_then_signalled
try:
    trace.TraceInstance(["cxl/cxl_poison"])
    print("no signal")
except Stop:
    print("signalled", tracefs())
trace._mount_tracefs = mount
trace.TraceInstance(["cxl/cxl_poison"])  # dropped unclosed
print("dropped", tracefs())
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="mounts tracefs: needs root and unshare")  # fmt: skip
def test_a_signal_while_the_trace_instance_is_made_leaves_nothing_mounted() -> None:
    if not Path("/sys/kernel/tracing").is_dir():
        pytest.skip("this kernel has no tracefs mount point")
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                        TRACE_SETUP_SIGNALLED], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, check=False)  # fmt: skip
    assert p.stdout == "signalled []\ndropped []\n", p.stderr


# --- top -- COMMAND: the signal goes to the command, top ends with it --------------------
def _top_with(command: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """pycxl top running ``command``, once it runs: top and the command's PID."""
    p = subprocess.Popen([*PYCXL, "top", "-b", "--", *command], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=_default_signals, start_new_session=True)  # fmt: skip
    began = time.monotonic()
    while time.monotonic() - began < 60:
        children = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
        if children and _running(int(children[0]), command[0]):
            return p, int(children[0])
        assert p.poll() is None, p.communicate()
        time.sleep(0.05)
    p.kill()
    pytest.fail(f"pycxl top started no {command}")


def _running(pid: int, name: str) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == name
    except FileNotFoundError:
        return False


def _catches(pid: int, sig: signal.Signals) -> bool:
    """``pid`` has a handler for ``sig`` (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    mask = next(int(line.split()[1], 16) for line in status.splitlines()
                if line.startswith("SigCgt:"))  # fmt: skip
    return bool(mask >> (sig - 1) & 1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                                 signal.SIGUSR1])  # fmt: skip
def test_top_sends_a_signal_on_to_its_command_and_ends_with_it(sig: signal.Signals) -> None:
    p, child = _top_with(["sleep", "30"])
    p.send_signal(sig)
    sent = time.monotonic()
    _, err = p.communicate(timeout=30)
    took = time.monotonic() - sent
    assert p.returncode == -sig, err  # sleep ended by it, and top as its command ended
    assert took < PROMPT_S, f"{took:.1f} s from the signal to top's exit"
    assert not Path(f"/proc/{child}").exists(), "the command was left behind"
    assert err == b"", err


def test_top_ends_with_the_status_of_a_command_that_handles_the_signal() -> None:
    p, child = _top_with(["sh", "-c", "trap 'exit 3' TERM; while :; do sleep 0.05; done"])
    deadline = time.monotonic() + 30  # the shell's trap set (a busy host runs it late)
    while not _catches(child, signal.SIGTERM) and time.monotonic() < deadline:
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 3, err


def test_top_without_a_command_ends_by_the_signal() -> None:
    p = subprocess.Popen([*PYCXL, "top", "-b", "-d", "0.2"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, preexec_fn=_default_signals)  # fmt: skip
    assert p.stdout is not None
    p.stdout.readline()  # it runs
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGTERM and err == b"", err


COUNTS_SIGINT = """
import pathlib, signal, sys, time
got = []
signal.signal(signal.SIGINT, lambda *_: got.append(1))
out = pathlib.Path(sys.argv[1])
out.write_text("ready")
while not got:
    time.sleep(0.01)
time.sleep(0.5)  # a SIGINT sent again would come within this
out.write_text(str(len(got)))
"""


def test_ctrl_c_at_the_terminal_reaches_the_command_once(tmp_path: Path) -> None:
    """The terminal gives Ctrl-C to its whole foreground process group, top and its
    command: top does not send it again."""
    import fcntl
    import termios

    def own_terminal() -> None:  # after setsid: the pseudo-terminal on stdin becomes ours
        _default_signals()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    count = tmp_path / "count"
    master, slave = pty.openpty()
    p = subprocess.Popen([*PYCXL, "top", "-b", "-d", "0.2", "--", sys.executable, "-c",
                          COUNTS_SIGINT, str(count)], cwd=ROOT, stdin=slave, stdout=slave,
                         stderr=subprocess.PIPE, start_new_session=True,
                         preexec_fn=own_terminal)  # fmt: skip
    os.close(slave)
    try:
        began = time.monotonic()
        while not count.exists() and time.monotonic() - began < 60:
            _drain(master)
        os.write(master, b"\x03")  # Ctrl-C
        while p.poll() is None and time.monotonic() - began < 60:
            _drain(master)
        _, err = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    assert (p.returncode, count.read_text()) == (0, "1"), err


def _drain(master: int) -> None:
    if select.select([master], [], [], 0.05)[0]:
        with contextlib.suppress(OSError):
            os.read(master, 65536)


# --- a reader that goes away ---------------------------------------------------------------
# Each command, with arguments that print at once and cheaply; the reason where none do.
PLAN_TRAIN = ["--layers", "2", "--hidden", "64", "--tokens", "8", "--hbm", "1G"]  # rates given
PIPED = {
    "list": ["list", "-vvv", "--sysroot", REGION],
    "region": ["region", "create", "--dry-run", "--sysroot", str(TREES / "two-dev" / "fresh")],
    "numa": ["numa", "--set-weights", "node0=1,node1=2", "--dry-run", "--sysroot", REGION],
    "run": ["run", "-m", "dram0", "--", "yes"],  # the command meets the pipe, as under numactl
    "where": ["where", str(os.getpid())],
    "pin-probe": ["pin-probe", "dram0", "--size", "64K"],
    "bench": ["bench", "first-touch", "-t", "dram0", "--size", "1M"],
    "testbed": ["testbed", "--list-topologies"],
    "check": ["check", "--no-health", "--sysroot", REGION],
    "stat": ["stat", "--sysroot", REGION],
    "labels": ["labels", "-F", "nfd", "--no-health", "--sysroot", REGION],
    "spill": ["spill", "--help"],  # the program's own output is Python's to handle
    "plan-train": ["plan-train", *PLAN_TRAIN, "--link", "50", "--tflops", "1", "--cpu-update", "1"],
    "top": ["top", "-c", "1", "-d", "0.05", "-b"],
    "memdev": ["memdev", "zero-labels", "all", "--dry-run", "--sysroot", PMEM],
    "port": ["port", "disable", "all", "-f", "--dry-run", "--sysroot", REGION],
    "bus": ["bus", "disable", "root0", "-f", "--dry-run", "--sysroot", REGION],
}
NOT_PIPED = {"monitor": "prints only when the kernel has an event"}


def test_every_command_is_walked_for_a_reader_gone() -> None:
    assert set(PIPED) | set(NOT_PIPED) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(PIPED))
def test_a_reader_gone_ends_the_command_as_sigpipe(command: str) -> None:
    read, write = os.pipe()
    os.close(read)  # gone before anything is written: every write meets EPIPE
    try:
        p = subprocess.run([*PYCXL, *PIPED[command]], cwd=ROOT, stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=120,
                           check=False)  # fmt: skip
    finally:
        os.close(write)
    assert p.returncode == -signal.SIGPIPE, p.stderr
    assert "Traceback" not in p.stderr and "error" not in p.stderr, p.stderr


def test_a_pipefail_script_sees_141_and_nothing_said() -> None:
    # true reads nothing and is gone long before pycxl has started (head -c1 would race
    # numa's few short writes, as it races cxl list's)
    script = f"set -o pipefail; {' '.join(PYCXL)} numa | true; echo $?"
    p = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, check=False)  # fmt: skip
    assert (p.stdout, p.stderr) == ("141\n", ""), p


def test_help_to_a_reader_gone_ends_as_sigpipe() -> None:
    read, write = os.pipe()
    os.close(read)
    p = subprocess.run([*PYCXL, "--help"], cwd=ROOT, stdout=write, stderr=subprocess.PIPE,
                       timeout=60, check=False)  # fmt: skip
    os.close(write)
    assert (p.returncode, p.stderr) == (-signal.SIGPIPE, b"")


# --- top on a terminal that cannot be redrawn -----------------------------------------------
def _on_a_terminal(argv: list[str], env: dict[str, str]) -> bytes:
    """What ``argv`` writes to a terminal (a pseudo-terminal's master side)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=slave,
                         stderr=subprocess.PIPE, env=env)  # fmt: skip
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the writer closed the terminal
            break
        if not data:
            break
        out += data
    os.close(master)
    assert p.wait(timeout=60) == 0, p.stderr.read() if p.stderr else ""
    return out


@pytest.mark.parametrize("term", ["dumb", None, "xterm"])
def test_top_redraws_only_where_the_terminal_can(term: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TERM"}
    if term is not None:
        env["TERM"] = term
    out = _on_a_terminal([*PYCXL, "top", "-c", "2", "-d", "0.1"], env)
    if term == "xterm":  # the table, cleared and drawn again
        assert b"\x1b[2J" in out, out
    else:  # dmon's lines, one report after another
        assert b"\x1b" not in out and out.count(b"\n#time") == 1, out


# --- a buffer freed under an interrupt ---------------------------------------------------
def _mapped(address: int) -> bool:
    with open("/proc/self/maps") as f:
        for line in f:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if start <= address < end:
                return True
    return False


def _view_then_interrupt(buf: NumaBuffer) -> None:
    view = buf.array("float64")  # held by this frame when the interrupt lands
    assert view.size
    raise KeyboardInterrupt


def test_an_interrupt_with_a_view_alive_stays_an_interrupt_and_the_buffer_goes() -> None:
    interrupted = False
    address = 0
    try:
        with NumaBuffer(1 << 20, Policy.bind(0)) as buf:
            address = buf.address
            _view_then_interrupt(buf)
    except KeyboardInterrupt:  # not OperationError("still used by arrays")
        interrupted = True
    del buf
    assert interrupted and not _mapped(address)


def test_a_closed_buffer_with_a_view_alive_is_still_an_error() -> None:
    from pycxl.base.errors import OperationError

    with pytest.raises(OperationError, match="still used by arrays"):  # noqa: SIM117
        with NumaBuffer(1 << 20, Policy.bind(0)) as buf:
            view = buf.array()
    del view
    buf.close()
