"""perf_event_open(2) for counting: one counter of a PMU on one CPU, system-wide
(``pid`` -1), read as the kernel keeps it, with the time it was enabled and running so
that a counter the kernel multiplexed is scaled as ``perf stat`` scales it.

The system call has no libc wrapper; it is made through libc's ``syscall``, loaded on
first use (importing this module loads nothing)."""

from __future__ import annotations

import errno
import os
import platform
import struct
from dataclasses import dataclass
from typing import Any

# linux/perf_event.h: perf_event_attr up to config2 (PERF_ATTR_SIZE_VER1), the read format
ATTR_SIZE = 72
FORMAT_TOTAL_TIME_ENABLED = 1 << 0
FORMAT_TOTAL_TIME_RUNNING = 1 << 1
FLAG_DISABLED = 1 << 0
PERF_FLAG_FD_CLOEXEC = 1 << 3
# the system call's number by architecture (the kernel's syscall tables)
SYSCALL = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "ppc64": 319, "s390x": 331,
           "riscv64": 241, "loongarch64": 241}  # fmt: skip
_READ = struct.Struct("=QQQ")  # value, time enabled, time running (ns)

_libc: Any = None


class PerfRefused(Exception):
    """The kernel refused a counter: ``errno`` says why (EACCES: perf_event_paranoid or
    no privilege; ENOENT, EINVAL: the PMU does not take this event; ENODEV: no such
    PMU or CPU)."""

    def __init__(self, err: int, what: str) -> None:
        self.errno = err
        super().__init__(f"{what}: {os.strerror(err)}")


@dataclass(frozen=True)
class Count:
    """A counter's value, and how long it was enabled and counting (ns)."""

    value: int
    enabled_ns: int
    running_ns: int

    @property
    def scaled(self) -> float:
        """The value as if it had counted the whole time (perf stat's scaling); the value
        itself when it counted all along or not yet at all."""
        if self.running_ns and self.running_ns < self.enabled_ns:
            return self.value * self.enabled_ns / self.running_ns
        return float(self.value)


def attr_bytes(pmu_type: int, config: int, config1: int = 0, config2: int = 0) -> bytes:
    """A perf_event_attr that counts ``config`` of PMU ``pmu_type``, enabled at once,
    reading with its enabled and running times."""
    read_format = FORMAT_TOTAL_TIME_ENABLED | FORMAT_TOTAL_TIME_RUNNING
    return struct.pack("=IIQQQQQIIQQ", pmu_type, ATTR_SIZE, config, 0, 0, read_format, 0,
                       0, 0, config1, config2)  # fmt: skip


def open_counter(pmu_type: int, config: int, cpu: int, config1: int = 0, config2: int = 0) -> int:
    """A file descriptor counting the event on ``cpu`` for every process; PerfRefused
    when the kernel says no."""
    import ctypes

    global _libc
    number = SYSCALL.get(platform.machine())
    if number is None:
        raise PerfRefused(errno.ENOSYS, f"perf_event_open on {platform.machine()}")
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    attr = ctypes.create_string_buffer(attr_bytes(pmu_type, config, config1, config2), ATTR_SIZE)
    fd = _libc.syscall(ctypes.c_long(number), attr, ctypes.c_int(-1), ctypes.c_int(cpu),
                       ctypes.c_int(-1), ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))  # fmt: skip
    if fd < 0:
        raise PerfRefused(ctypes.get_errno(), f"perf_event_open(type {pmu_type}, config "
                          f"{config:#x}, cpu {cpu})")  # fmt: skip
    return int(fd)


def read_count(fd: int) -> Count:
    """The counter's value now, with its enabled and running times."""
    value, enabled, running = _READ.unpack(os.read(fd, _READ.size))
    return Count(value, enabled, running)
