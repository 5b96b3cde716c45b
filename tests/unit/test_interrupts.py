"""Ctrl-C during a measurement. The compiled loops return to Python at least every
``compiled.CALL_NS`` (plus one sample), so a real SIGINT ends ``pycxl bench`` within a
fraction of a second, by SIGINT (status 130 in a shell), with one line; and cutting the
work into calls neither loses nor changes any of it (same kernels in order, same pages,
same chase).

The bounds are generous for a busy small host: the loops answer in about 0.2 s, where
before they ran to the end of the run (25 s and more for these commands)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pycxl import bench
from pycxl.base._lib import compiled
from pycxl.measure.results import BandwidthResult
from pycxl.numa.placement import NumaBuffer
from pycxl.numa.policy import Policy

MiB = 1 << 20
ANSWER_S = 5.0  # SIGINT to exit
START_S = 180.0  # for the child to reach its measurement
ROOT = Path(__file__).resolve().parents[2]


def _status_kib(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _needs(nbytes: int) -> None:
    if _available() < nbytes:
        pytest.skip(f"needs {nbytes // MiB} MiB of available memory")


def _interrupt(argv: list[str], touched: int, settle: float) -> tuple[int, str, float]:
    """Start ``argv``; once it has touched ``touched`` bytes of its own memory and
    ``settle`` seconds more have passed (it is measuring), SIGINT it: its status, its
    stderr and the seconds from the signal to its exit."""
    env = {k: v for k, v in os.environ.items() if k != "PYCXL_BENCH_QUICK"}
    # a terminal's Ctrl-C: the child takes SIGINT as a shell in the foreground gives it,
    # also where these tests run in the background (started with &, SIGINT is ignored
    # and the child would inherit that)
    child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             preexec_fn=_default_sigint)  # fmt: skip
    try:
        began = time.monotonic()
        while _status_kib(child.pid, "RssAnon") * 1024 < touched:
            if child.poll() is not None:
                pytest.fail(f"{argv} ended before measuring: {child.communicate()}")
            if time.monotonic() - began > START_S:
                pytest.fail(f"{argv} touched no {touched} bytes in {START_S} s")
            time.sleep(0.02)
        time.sleep(settle)
        assert child.poll() is None, f"{argv} ended before the signal"
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = child.communicate(timeout=120)
        return child.returncode, err, time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "pycxl.cli.main", *args]


def _assert_interrupted(rc: int, err: str, took: float) -> None:
    assert rc == -signal.SIGINT, err  # ended by SIGINT after its clean-up: a shell says 130
    assert err.strip() == "pycxl: interrupted"  # one line, no traceback
    assert took < ANSWER_S, f"{took:.1f} s from SIGINT to exit"


def test_ctrl_c_stops_stream_between_kernels() -> None:
    _needs(2 << 30)
    # the three arrays are touched by the untimed first pass; then 200 timed passes
    _assert_interrupted(*_interrupt(_cli("bench", "bandwidth", "-t", "dram0", "--size", "256M",
                                         "-n", "200"), 700 * MiB, 1.0))  # fmt: skip


def test_ctrl_c_stops_chase_samples() -> None:
    _needs(1 << 30)
    _assert_interrupted(*_interrupt(_cli("bench", "latency", "-t", "dram0", "--size", "256M",
                                         "-n", "200"), 240 * MiB, 1.0))  # fmt: skip


def test_ctrl_c_stops_one_long_chase_sample() -> None:
    """One sample of 2^28 loads (half a minute here) is cut into calls too."""
    code = (
        "import sys\n"
        "from pycxl import bench\n"
        "try:\n"
        "    bench.measure_latency('dram0', size='64M', samples=2, loads=1 << 28)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', file=sys.stderr)\n"
        "    sys.exit(130)\n"
    )
    rc, err, took = _interrupt([sys.executable, "-c", code], 64 * MiB, 1.0)
    assert (rc, err.strip()) == (130, "interrupted")
    assert took < ANSWER_S, f"{took:.1f} s from SIGINT to exit"


def test_ctrl_c_stops_loaded_chase_windows() -> None:
    """A 30 s point of loaded latency: chase windows while load threads run."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("loaded latency needs a CPU for the chase and one for the load")
    _needs(1 << 30)
    _assert_interrupted(*_interrupt(_cli("bench", "loaded-latency", "-t", "dram0", "--size",
                                         "64M", "--load-size", "16M", "--duration", "30"),
                                    80 * MiB, 1.5))  # fmt: skip


def test_ctrl_c_stops_first_touch() -> None:
    _needs(4 << 30)
    _assert_interrupted(*_interrupt(_cli("bench", "first-touch", "-t", "dram0", "--size", "2G"),
                                    256 * MiB, 0.2))  # fmt: skip


# --- the work cut into calls is the work of one call ---------------------------------------
class _Counting:
    """The compiled library, counting calls to each function and keeping the last
    call's arguments."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.calls: dict[str, int] = {}
        self.last: dict[str, tuple[Any, ...]] = {}

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.lib, name)

        def counted(*args: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            self.last[name] = args
            return fn(*args)

        return counted


@pytest.fixture
def one_sample_a_call(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, _Counting]:
    """Every call's budget spent at once: each call does one sample (or 16 loads)."""
    ffi, lib = compiled._compiled()
    counting = _Counting(lib)
    monkeypatch.setattr(compiled, "_compiled", lambda: (ffi, counting))
    monkeypatch.setattr(compiled, "CALL_NS", 1)
    return ffi, counting


def test_stream_one_kernel_a_call_keeps_order(one_sample_a_call: tuple[Any, _Counting]) -> None:
    _, lib = one_sample_a_call
    results = bench.measure_bandwidth("dram0", size="16M", samples=3)  # validates the arrays
    assert lib.calls["stream_steps"] == 1 + 4 * (3 + 1)  # the first touch, then each kernel
    assert lib.calls["stream_start"] == lib.calls["stream_end"] == 2
    for r in results:
        assert isinstance(r, BandwidthResult) and 1e8 < r.bytes_per_s < 1e13


def test_first_touch_one_page_a_call(one_sample_a_call: tuple[Any, _Counting]) -> None:
    import numpy as np

    _, lib = one_sample_a_call
    npages = 64
    ns = np.zeros(npages, dtype=np.uint32)
    with NumaBuffer(npages * 4096, Policy.bind(0), populate=False) as buf:
        total = compiled.first_touch(buf.address, npages, 4096, ns)
        assert buf.pages_by_node() == {0: npages}
    assert lib.calls["first_touch"] == npages
    assert (ns > 0).all() and total == int(ns.sum())


def test_chase_build_in_calls_builds_the_same_cycle(
    one_sample_a_call: tuple[Any, _Counting],
) -> None:
    import numpy as np

    _, lib = one_sample_a_call
    size, group = 4 * MiB, 64 * 4096
    cycles = []
    for budget in (1, 10**12):  # one group a call, all in one
        compiled.CALL_NS = budget
        arena = np.zeros(size // 8, dtype=np.uint64)
        compiled.chase_build(arena.ctypes.data, size, 256, group)
        cycles.append(arena[:: 256 // 8] - arena.ctypes.data)  # as offsets
    assert lib.calls["chase_build_step"] == size // group + 1
    assert (cycles[0] == cycles[1]).all()


def test_chase_in_parts_follows_one_chase(one_sample_a_call: tuple[Any, _Counting]) -> None:
    import numpy as np

    ffi, lib = one_sample_a_call
    size, loads = MiB, 1 << 18
    arena = np.zeros(size // 8, dtype=np.uint64)
    compiled.chase_build(arena.ctypes.data, size, 256, 64 * 4096)
    assert compiled.chase_run(arena.ctypes.data, loads) > 0
    assert lib.calls["chase_run"] == 1 + (loads - compiled.FIRST_LOADS) // 16
    # the parts stop where one call of all the loads stops
    parts_end = lib.last["chase_run"][0][0]
    whole = ffi.new("void **", ffi.cast("void *", arena.ctypes.data))
    lib.lib.chase_run(whole, loads)
    assert int(ffi.cast("uintptr_t", parts_end)) == int(ffi.cast("uintptr_t", whole[0]))


def test_chase_windows_in_calls_fill_the_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    monkeypatch.setattr(compiled, "CALL_NS", 5_000_000)
    size = MiB
    arena = np.zeros(size // 8, dtype=np.uint64)
    compiled.chase_build(arena.ctypes.data, size, 256, 64 * 4096)
    began = time.monotonic()
    windows = compiled.ChaseCursor(arena.ctypes.data).windows(64, 0.05)
    elapsed = time.monotonic() - began
    # the windows fill the time, or the buffer sized for 10 ns a load first (a 1 MiB
    # arena can sit in a cache, where a load takes less)
    assert elapsed >= 0.05 or len(windows) == int(0.05e9 / (64 * 10)) + 16, (elapsed, len(windows))
    assert len(windows) > 1 and all(w > 0 for w in windows)
