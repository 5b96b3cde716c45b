"""Kernel trace events, read from a private tracefs instance.

pycxl never touches the global trace buffer: it makes its own instance
(``instances/pycxl-PID-N``), enables only the events it wants there, reads that
instance's ``trace_pipe``, and removes the instance when done (``close()``, ``with``),
which also disables its events. Where tracefs was not mounted, the instance mounts it
and unmounts it again when closed: tracing is left as it was found. Lines are parsed
into ``TraceEvent``s.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import os
import re
import select
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from .errors import NeedsRootError, NotAvailableError, OperationError
from .sysfs import Sysfs

TRACEFS_PATHS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
_LINE = re.compile(
    r"^\s*(?P<task>.*?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?:\S+\s+)?"
    r"(?P<ts>\d+\.\d+):\s+(?P<event>\w+):\s?(?P<body>.*)$"
)
_FIELD = re.compile(r"(\w+)=('(?:[^']*)'|\"(?:[^\"]*)\"|\S*)")
_counter = itertools.count()
# signals that come from outside the process (not a fault of the code running)
_ASYNC_SIGNALS = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV,
                                           signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
                                           signal.SIGTRAP, signal.SIGSYS}  # fmt: skip


@dataclass(frozen=True)
class TraceEvent:
    """One trace event: its name, the kernel's timestamp (s), and its fields."""

    name: str
    timestamp: float
    fields: dict[str, str] = field(default_factory=dict, hash=False)


def parse_line(line: str) -> TraceEvent | None:
    """A trace_pipe line as an event (None for lines that are not events)."""
    m = _LINE.match(line)
    if not m:
        return None
    fields = {k: v[1:-1] if v[:1] in "'\"" and v[-1:] == v[:1] and len(v) > 1 else v
              for k, v in _FIELD.findall(m.group("body"))}  # fmt: skip
    return TraceEvent(m.group("event"), float(m.group("ts")), fields)


def find_tracefs(fs: Sysfs | None = None) -> str | None:
    """The mounted tracefs, as a kernel path; None when it is not mounted."""
    fs = fs or Sysfs()
    return next((p for p in TRACEFS_PATHS if fs.is_dir(f"{p}/instances")), None)


def tracefs(fs: Sysfs | None = None) -> str:
    """The mounted tracefs, as a kernel path; NotAvailableError says how to mount it."""
    found = find_tracefs(fs)
    if found is None:
        raise NotAvailableError(
            "tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing): the "
            "kernel's CXL events are read from it"
        )
    return found


def _mount_tracefs(fs: Sysfs) -> str:
    """Mount tracefs where the kernel provides a mount point, as libtracefs does (root);
    the caller unmounts it when done."""
    if fs.path("/") == "/" and os.geteuid() != 0:
        raise NeedsRootError("the kernel's trace events (tracefs) need root")
    if fs.path("/") == "/" and os.path.isdir(TRACEFS_PATHS[0]):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(b"nodev", TRACEFS_PATHS[0].encode(), b"tracefs", 0, None) == 0:
            return TRACEFS_PATHS[0]
    return tracefs(fs)  # raises, saying how to mount it


def _unmount_tracefs(path: str) -> None:
    """Unmount the tracefs this process mounted; one still in use (another reader
    mounted nothing and uses it now) stays mounted: EBUSY is not an error."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(path.encode(), 0) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EBUSY, errno.EINVAL):
            raise OperationError(f"cannot unmount the tracefs mounted at {path}: "
                                 f"{os.strerror(err)}")  # fmt: skip


class TraceInstance:
    """A private trace instance with ``events`` ('cxl/cxl_poison'...) enabled; events
    the kernel does not have are listed in ``missing``."""

    def __init__(self, events: Iterable[str], fs: Sysfs | None = None) -> None:
        self.fs = fs or Sysfs()
        self.mounted: str | None = None  # the tracefs this instance mounted, if any
        self.path = ""  # the instance, once made
        self.enabled: list[str] = []
        self.missing: list[str] = []
        self._fd = -1
        self._pending = b""
        # Signals wait while the mount and the instance are made and noted, so that one
        # (Ctrl-C, SIGTERM) cannot leave them behind unnoted; it comes inside the try below.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC_SIGNALS)
        try:
            self._make()
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
                self._enable(events)
            except BaseException:
                self.close()
                raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def _make(self) -> None:
        base = find_tracefs(self.fs)
        if base is None:
            base = self.mounted = _mount_tracefs(self.fs)
        path = f"{base}/instances/pycxl-{os.getpid()}-{next(_counter)}"
        try:
            os.mkdir(self.fs.path(path))
        except OSError as e:
            self._unmount()
            if isinstance(e, PermissionError):
                raise NeedsRootError("reading the kernel's trace events needs root") from None
            raise OperationError(f"cannot make trace instance {path}: {e.strerror}") from e
        self.path = path

    def _enable(self, events: Iterable[str]) -> None:
        for ev in events:
            if self.fs.exists(f"{self.path}/events/{ev}/enable"):
                self.fs.write(f"{self.path}/events/{ev}/enable", "1")
                self.enabled.append(ev)
            else:
                self.missing.append(ev)
        self._fd = os.open(self.fs.path(f"{self.path}/trace_pipe"),
                           os.O_RDONLY | os.O_NONBLOCK)  # fmt: skip

    def fileno(self) -> int:
        """The trace_pipe's descriptor, for select()."""
        return self._fd

    def read(self, timeout: float = 0.0) -> list[TraceEvent]:
        """Events that have arrived, waiting up to ``timeout`` seconds for the first."""
        if timeout > 0:
            select.select([self._fd], [], [], timeout)
        chunks = []
        while True:
            try:
                data = os.read(self._fd, 65536)
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    break
                raise
            if not data:
                break
            chunks.append(data)
        self._pending += b"".join(chunks)
        *lines, self._pending = self._pending.split(b"\n")
        out = []
        for raw in lines:
            ev = parse_line(raw.decode(errors="replace"))
            if ev is not None:
                out.append(ev)
        return out

    def drain(self, quiet: float = 0.2, limit: float = 5.0) -> list[TraceEvent]:
        """Events until none has come for ``quiet`` seconds (at most ``limit``)."""
        out: list[TraceEvent] = []
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            got = self.read(quiet)
            if not got:
                break
            out += got
        return out

    def close(self) -> None:
        """Disable the events and remove the instance."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        for ev in self.enabled:
            with contextlib.suppress(OperationError):  # the instance goes anyway
                self.fs.write(f"{self.path}/events/{ev}/enable", "0")
        self.enabled = []
        path, self.path = self.path, ""
        try:
            if path:
                os.rmdir(self.fs.path(path))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise OperationError(f"cannot remove trace instance {path}: {e.strerror}") from e
        finally:
            self._unmount()

    def __del__(self) -> None:
        # one dropped unclosed (a signal between its making and the caller's try) goes too
        with contextlib.suppress(Exception):
            self.close()

    def _unmount(self) -> None:
        if self.mounted is not None:
            path, self.mounted = self.mounted, None
            _unmount_tracefs(path)

    def __enter__(self) -> TraceInstance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
