"""NVML started once per process, optionally on a thread of its own.

Starting NVML waits on the driver: on an H200 host ``nvmlInit_v2`` takes about 11 ms and
the first device handle about 7 ms more, nearly all of it in the kernel. ``begin()``
starts both on a thread (cffi lets go of the GIL around each C call), so a command can
import and read the rest of the host meanwhile; ``session()`` waits for that start, or
starts NVML itself where nothing began it. Importing this module loads no library.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..base._lib.libs import LIBNVML
from ..base.errors import LibraryNotFoundError
from ..base.sysfs import Sysfs

if TYPE_CHECKING:
    from .inventory import GpuSource

NVML_SUCCESS = 0
# one folder per GPU the NVIDIA kernel driver holds (procfs.py reads them)
GPUS_DIR = "/proc/driver/nvidia/gpus"


class NvmlUnusable(Exception):
    """NVML is absent or would not start; the message says why."""


_lock = threading.Lock()
_starter: threading.Thread | None = None
# (ffi, lib) once started; or why the last start failed (words, or what it raised), until
# a caller is told: the next one tries again (a driver can come up after a first call)
_outcome: tuple[Any, Any] | str | Exception | None = None


def _forget_after_fork() -> None:
    """A forked child has no starting thread and may inherit a held lock: it keeps only
    a started NVML, as it did before threads were used."""
    global _lock, _starter, _outcome
    _lock, _starter = threading.Lock(), None
    if not isinstance(_outcome, tuple):
        _outcome = None


os.register_at_fork(after_in_child=_forget_after_fork)


def begin_reading(fs: Sysfs, via: GpuSource = "auto") -> None:
    """``begin()`` where ``read_gpus(fs, via=via)`` will ask NVML: this machine (not a
    recorded tree), NVML allowed, and an NVIDIA driver loaded (else NVML would only say
    that it is not)."""
    if fs.root == "/" and via in ("auto", "nvml") and fs.exists(GPUS_DIR):
        begin()


def begin() -> None:
    """Start NVML and open each GPU's handle on a background thread, if nothing has yet.
    Costs the caller a thread's start; what fails is reported by ``session()``."""
    global _starter
    with _lock:
        if _starter is not None or _outcome is not None:
            return
        # a daemon: a command that ends (or fails) before asking for GPUs does not wait
        _starter = threading.Thread(target=_start_reporting, name="pycxl-nvml-start", daemon=True)
        _starter.start()


@contextmanager
def session() -> Iterator[tuple[Any, Any]]:
    """(ffi, lib) of NVML, started on first use and left running: nvmlShutdown would
    cost every command about 3 ms, and the process's end releases NVML anyway.
    Raises NvmlUnusable when it cannot start (a later call tries again)."""
    global _outcome, _starter
    starter = _starter
    if starter is not None:
        starter.join()
    with _lock:
        if _outcome is None:  # nothing began it, or its thread left no word (it died)
            _starter = None
            _start()
        outcome = _outcome
        if not isinstance(outcome, tuple):
            _outcome, _starter = None, None  # reported once; the next caller tries again
    if isinstance(outcome, Exception):
        raise outcome  # a bug on the starting thread, raised where it is waited for
    if not isinstance(outcome, tuple):
        raise NvmlUnusable(str(outcome))
    yield outcome


def error_text(ffi: Any, lib: Any, rc: int) -> str:
    """NVML's words for a return code."""
    from ..base._lib.loader import cstr

    return cstr(ffi, lib.nvmlErrorString(rc)) or f"error {rc}"


def _start_reporting() -> None:
    global _outcome
    try:
        _start()
    except Exception as e:  # handed to session(), which raises it where it waits
        _outcome = e


def _start() -> None:
    global _outcome
    try:
        ffi, lib = LIBNVML.load()
    except LibraryNotFoundError:
        _outcome = f"{LIBNVML.sonames[0]} not found"
        return
    rc = lib.nvmlInit_v2()
    if rc != NVML_SUCCESS:
        _outcome = f"NVML: {error_text(ffi, lib, rc)}"
        return
    # The first handle of a GPU is the slow part after nvmlInit (the driver attaches to
    # the GPU); later lookups of the same GPU are quick.
    count, handle = ffi.new("unsigned int *"), ffi.new("nvmlDevice_t *")
    if lib.nvmlDeviceGetCount_v2(count) == NVML_SUCCESS:
        for i in range(count[0]):
            lib.nvmlDeviceGetHandleByIndex_v2(i, handle)
    _outcome = (ffi, lib)
