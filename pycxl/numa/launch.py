"""Start a command under a memory policy and CPU binding, as numactl does: set them on
this process, then exec the command, which keeps the PID and receives its signals
directly. Nothing system-wide is changed. Before the exec, the signal dispositions
Python changed are put back (it ignores SIGPIPE and SIGXFSZ, and an ignored signal
stays ignored across exec), so a pipeline behaves as it does under numactl.

Names (``--membind cxl0``) are resolved above this floor (``System.launch_settings``);
this module takes node and CPU ids.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from ..base.errors import CommandNotExecutableError, CommandNotFoundError, InvalidRequestError
from .policy import Policy, set_thread_policy


@dataclass(frozen=True)
class LaunchSettings:
    """What to set before the command starts: a memory policy and a CPU set."""

    policy: Policy | None = None
    cpus: tuple[int, ...] = ()

    def describe(self) -> str:
        """The settings in words ('bind 1; cpus 0,1')."""
        parts = [self.policy.describe()] if self.policy else []
        if self.cpus:
            parts.append("cpus " + ",".join(map(str, self.cpus)))
        return "; ".join(parts) or "no change"


def find_command(argv: Sequence[str]) -> str:
    """The executable ``argv[0]`` names (a path, or found on PATH); checked up front so
    a typo is an error before anything is set."""
    if not argv:
        raise InvalidRequestError("no command given; put it after '--'")
    name = argv[0]
    path = name if os.sep in name else shutil.which(name)
    if path is None or not os.path.exists(path):
        raise CommandNotFoundError(f"command not found: {name}")
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise CommandNotExecutableError(f"cannot execute {name}: permission denied")
    return path


def restore_default_signals() -> None:
    """Undo, in this process, what Python did to signals, before it becomes another
    program: SIGPIPE and SIGXFSZ back to their default action (Python ignores both, and
    the command would inherit that: ``yes | head -1`` would print 'Broken pipe' and exit
    1 instead of dying of SIGPIPE), every handler Python or pycxl installed (SIGINT...)
    back to the default, and no signal blocked. Signals that whoever started pycxl
    ignored (nohup's SIGHUP) stay ignored, as numactl leaves them."""
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    for sig in signal.valid_signals():
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP, signals libc keeps for itself
            continue
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def exec_command(settings: LaunchSettings, argv: Sequence[str]) -> None:
    """Apply ``settings`` to this process and replace it with ``argv`` (never returns)."""
    path = find_command(argv)
    if settings.cpus:
        try:
            os.sched_setaffinity(0, settings.cpus)
        except OSError as e:
            raise InvalidRequestError(
                f"cannot run on CPUs {','.join(map(str, settings.cpus))}: {e.strerror} "
                "(outside this process's cpuset?)"
            ) from None
    if settings.policy is not None:
        set_thread_policy(settings.policy)
    restore_default_signals()
    try:
        os.execv(path, list(argv))
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise CommandNotFoundError(f"command not found: {argv[0]}") from None
        raise CommandNotExecutableError(f"cannot execute {argv[0]}: {e.strerror}") from None
