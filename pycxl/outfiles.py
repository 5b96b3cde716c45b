"""Files pycxl writes for others to read (Prometheus textfiles, the event log, plots,
scheduler and node-label files): checked before any work starts, written so that a
reader never sees half a file, and never through a symbolic link (pycxl often runs as
root, in folders other users can write to).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable

from .errors import InvalidRequestError, OperationError


def check_output_path(path: str, what: str, suffixes: Iterable[str] = ()) -> None:
    """Refuse, before anything runs, a path pycxl could not write or should not:
    empty, a directory, a symbolic link, in a folder that does not exist or is not
    writable, or (where ``suffixes`` are given) without one of them. ``what`` names the
    option or file in the message ('--plot', 'textfile')."""
    if not path:
        raise InvalidRequestError(f"{what}: the path is empty; give a file name")
    if os.path.isdir(path):
        raise InvalidRequestError(f"{what} {path} is a directory; give a file name in it")
    if os.path.islink(path):
        raise InvalidRequestError(
            f"{what} {path} is a symbolic link; pycxl does not write through links "
            "(give the real path)"
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
    symbolic link at ``path`` is replaced, never followed."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".pycxl-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise OperationError(f"cannot write {path}: {e.strerror}") from e


def append_line(path: str, line: str, mode: int = 0o644) -> None:
    """Append one line to ``path`` (created if absent), synced before returning; a
    symbolic link at ``path`` is refused (O_NOFOLLOW), not followed."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, mode)
    except OSError as e:
        if os.path.islink(path):
            raise OperationError(
                f"cannot append to {path}: it is a symbolic link, which pycxl does not "
                "follow (give the real path)"
            ) from e
        raise OperationError(f"cannot append to {path}: {e.strerror}") from e
    try:
        os.write(fd, (line if line.endswith("\n") else line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
