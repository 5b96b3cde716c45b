"""Files pycxl writes for others to read (Prometheus textfiles, the event log, plots,
scheduler and node-label files): checked before any work starts, written so that a
reader never sees half a file, and never through a symbolic link (pycxl often runs as
root, in folders other users can write to).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable

from .errors import InvalidRequestError, OperationError

STDOUT = "-"  # where an option allows it, standard output instead of a file

_SPECIAL = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def not_a_regular_file(path: str) -> str | None:
    """What ``path`` is, in words, when it exists and is neither a regular file nor a
    symbolic link (a device node, a FIFO, a socket, a folder); None otherwise. Such a
    path is never written: an atomic write renames over it and would replace
    /dev/null itself."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"not readable ({e.strerror})"
    if stat.S_ISDIR(mode):
        return "a directory"
    return next((words for test, words in _SPECIAL if test(mode)), None)


def check_output_path(
    path: str, what: str, suffixes: Iterable[str] = (), *, stdout: bool = False
) -> None:
    """Refuse, before anything runs, a path pycxl could not write or should not:
    empty, anything that exists and is not a regular file (a directory, a device node
    such as /dev/null, a FIFO, a socket, a symbolic link), in a folder that does not
    exist or is not writable, or (where ``suffixes`` are given) without one of them.
    ``stdout``: '-' means standard output. ``what`` names the option or file in the
    message ('--plot', 'textfile')."""
    if not path:
        raise InvalidRequestError(f"{what}: the path is empty; give a file name")
    if stdout and path == STDOUT:
        return
    instead = " or - for standard output" if stdout else ""
    kind = not_a_regular_file(path)
    if kind == "a directory":
        raise InvalidRequestError(f"{what} {path} is a directory; give a file name in it")
    if kind is not None:
        raise InvalidRequestError(
            f"{what} {path} is {kind}; pycxl writes only regular files (give a file name{instead})"
        )
    if os.path.islink(path):
        raise InvalidRequestError(
            f"{what} {path} is a symbolic link; pycxl does not write through links "
            f"(give the real path{instead})"
        )
    allowed = tuple(suffixes)
    if allowed and not path.lower().endswith(allowed):
        raise InvalidRequestError(f"{what} {path}: the file name must end in {', '.join(allowed)}")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InvalidRequestError(f"{what} {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidRequestError(
            f"{what} {path}: directory {directory} is not writable by this user"
        )


def write_atomically(path: str, data: str | bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``: written to a temporary file in the same folder,
    synced, then renamed over it, so a reader sees the old file or the new one. A
    symbolic link at ``path`` is replaced, never followed; anything else that is not a
    regular file (a device node, a FIFO: it may have appeared since the path was
    checked) is refused, never replaced."""
    _refuse_special(path, "write")
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".pycxl-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        _refuse_special(path, "write")
        os.replace(tmp, path)
    except (OSError, OperationError) as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OperationError):
            raise
        raise OperationError(f"cannot write {path}: {e.strerror}") from e


def append_line(path: str, line: str, mode: int = 0o644) -> None:
    """Append one line to ``path`` (created if absent), synced before returning; a
    symbolic link at ``path`` is refused (O_NOFOLLOW), not followed, and so is
    anything else that is not a regular file (opened without blocking, so a FIFO with
    no reader cannot hang the caller)."""
    _refuse_special(path, "append to")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, mode)
    except OSError as e:
        if os.path.islink(path):
            raise OperationError(
                f"cannot append to {path}: it is a symbolic link, which pycxl does not "
                "follow (give the real path)"
            ) from e
        raise OperationError(f"cannot append to {path}: {e.strerror}") from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped in since the check above
            raise OperationError(f"cannot append to {path}: it is not a regular file")
        os.write(fd, (line if line.endswith("\n") else line + "\n").encode())
        os.fsync(fd)
    except OSError as e:  # a full disk, a quota, an I/O error
        raise OperationError(f"cannot append to {path}: {e.strerror}") from e
    finally:
        os.close(fd)


def _refuse_special(path: str, doing: str) -> None:
    kind = not_a_regular_file(path)
    if kind is not None:
        raise OperationError(
            f"cannot {doing} {path}: it is {kind}, and pycxl writes only regular files"
        )
