"""How pycxl ends on a signal, in one place.

Every signal a user, a session or a scheduler sends to end a program raises
``Terminated`` instead of ending pycxl at once, so the ``finally`` blocks and context
managers undo what pycxl set up in the kernel (a trace instance, a tracefs mount, mapped
buffers; ``top`` waits for the command it runs). Then pycxl ends by that same signal
(``die``): a shell reports 128+n and a parent sees it killed by the signal, as for any
program that signal ends. A reader that goes away (EPIPE on standard output) ends it as
SIGPIPE does, which is how ndctl's ``cxl list`` ends in ``| head``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn

# Signals whose default action ends a process and that are sent to end one. Not SIGPIPE
# and SIGXFSZ: Python ignores them, so a write fails with an error instead (EPIPE is
# turned into SIGPIPE's end below; EFBIG is an error).
TERMINATING = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGVTALRM,
    signal.SIGPROF,
    signal.SIGXCPU,
)
# the keyboard's signals: a terminal sends them to its whole foreground process group
KEYBOARD = (signal.SIGINT, signal.SIGQUIT)
# their default action dumps core; one taken after the clean-up would show nothing
DUMPS_CORE = (signal.SIGQUIT, signal.SIGXCPU)


class Terminated(BaseException):  # as KeyboardInterrupt: not an error
    """Raised where pycxl is when a terminating signal comes; no ``except Exception``
    takes it, so it unwinds everything on its way to cli.main."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_installed = False
_raising = False
_first: int | None = None  # the signal pycxl ends by, once one came
_forward: Callable[[int], None] | None = None


def _handle(signum: int, frame: FrameType | None) -> None:
    global _first
    if _forward is not None:
        _forward(signum)
        return
    if _first is not None:
        return  # already ending: a second signal does not cut the clean-up short
    _first = signum
    if _raising:
        raise Terminated(signum)


def install() -> Callable[[], None]:
    """Handle the terminating signals (those whoever started pycxl ignored stay ignored,
    as under nohup); returns what puts the previous handlers back. Only the main thread
    can; elsewhere, and when already installed, nothing changes."""
    global _installed, _first
    if _installed or not _in_main_thread():
        return lambda: None
    kept: dict[int, signal._HANDLER] = {}
    for s in TERMINATING:
        was = signal.getsignal(s)
        if was in (signal.SIG_DFL, signal.default_int_handler):
            kept[s] = was
            signal.signal(s, _handle)
    _installed, _first = True, None

    def restore() -> None:
        global _installed
        for s, was in kept.items():
            signal.signal(s, was)
        _installed = False

    return restore


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def raising() -> Iterator[None]:
    """While it holds, a terminating signal raises ``Terminated`` (once); outside, it is
    only kept, and ``ending()`` says which one came."""
    global _raising
    was, _raising = _raising, True
    try:
        if _first is not None:  # one came before: end now
            raise Terminated(_first)
        yield
    finally:
        _raising = was


@contextlib.contextmanager
def forwarded(send: Callable[[int], None]) -> Iterator[None]:
    """While it holds, terminating signals go to ``send`` (top's command) instead of
    ending pycxl."""
    global _forward
    was, _forward = _forward, send
    try:
        yield
    finally:
        _forward = was


def end_by(signum: int) -> int:
    """End pycxl by ``signum`` (unless a signal came first); the status a shell reports."""
    global _first
    if _first is None:
        _first = signum
    return 128 + _first


def ending() -> int | None:
    """The signal pycxl ends by, if one came (or ``end_by`` chose one)."""
    return _first


def from_keyboard(signum: int) -> bool:
    """Whether ``signum`` is the keyboard's (Ctrl-C, Ctrl-\\) while pycxl is in its
    terminal's foreground process group, which the terminal signals as a whole."""
    if signum not in KEYBOARD:
        return False
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False  # no controlling terminal
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def reader_gone() -> bool:
    """Whether standard output's (or error's) reader went away: the kernel reports an
    error condition on the writing end of a pipe with no reader, or of a socket shut
    down (poll)."""
    import select  # here: most commands never ask

    poll = select.poll()
    for fd in (1, 2):
        poll.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))


def die(signum: int) -> NoReturn:
    """End this process by ``signum``'s default action, after the clean-up."""
    if signum in DUMPS_CORE:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # not reached: the signal ends the process first
