"""Files pycxl writes for others to read (Prometheus textfiles, the event log, plots,
scheduler and node-label files, label areas read out): checked before any work starts,
written so that a reader never sees half a file, and never through a symbolic link
(pycxl often runs as root, in folders other users can write to). Every file pycxl
writes at a user's request goes through this module.

Rewriting a file keeps its mode, owner and group, as ``sed -i`` does (node_exporter
setups give the textfile folder's files a group and mode its reader relies on): the new
contents are written beside it, given the old file's metadata, then renamed over it.
Where that metadata cannot be kept (not root, and the file is another user's or of a
group this user is not in), the path is refused before any work. The file's POSIX
access ACL is kept too; other extended attributes (an SELinux label, ``user.*``) are
not copied: the new file has those its folder gives new files. A new file is created
0644 less the umask, as open(2) creates files.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import secrets
import stat
from collections.abc import Callable, Iterable
from typing import BinaryIO

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
    path: str, what: str, suffixes: Iterable[str] = (), *, stdout: bool = False,
    appends: bool = False,
) -> None:  # fmt: skip
    """Refuse, before anything runs, a path pycxl could not write or should not:
    empty, anything that exists and is not a regular file (a directory, a device node
    such as /dev/null, a FIFO, a socket, a symbolic link), in a folder that does not
    exist or is not writable, or (where ``suffixes`` are given) without one of them; an
    existing file whose owner and group the rewritten one could not keep, or (with
    ``appends``: lines are added to it in place) that this user cannot write.
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
    if appends:
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise InvalidRequestError(
                f"{what} {path} is not writable by this user; run as its owner or as root, "
                "or give another file"
            )
    else:
        _check_keepable(path, what)


def _check_keepable(path: str, what: str) -> None:
    """Refuse an existing file whose owner or group the new file could not be given:
    only root gives a file to another user, or to a group the caller is not in."""
    try:
        st = os.lstat(path)
    except OSError:
        return  # absent: a new file, this user's
    if os.geteuid() == 0 or not stat.S_ISREG(st.st_mode):
        return
    fix = f"run as {_user(st.st_uid)} or as root, or remove {path} first"
    if st.st_uid != os.geteuid():
        raise InvalidRequestError(
            f"{what} {path} belongs to {_user(st.st_uid)}: pycxl rewrites a file keeping its "
            f"owner, which only root can give it; {fix}"
        )
    if st.st_gid != os.getegid() and st.st_gid not in os.getgroups():
        raise InvalidRequestError(
            f"{what} {path} has group {_group(st.st_gid)}, which this user is not in: pycxl "
            f"rewrites a file keeping its group; run as a member of it or as root, or "
            f"remove {path} first"
        )


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def write_atomically(path: str, data: str | bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``: written to a temporary file in the same folder,
    given the old file's mode, owner, group and access ACL (a new file: ``mode`` less
    the umask), synced, then renamed over it, so a reader sees the old file or the new
    one. A symbolic link at ``path`` is replaced, never followed (nor its metadata
    copied); anything else that is not a regular file (a device node, a FIFO: it may have
    appeared since the path was checked) is refused, never replaced."""
    raw = data.encode() if isinstance(data, str) else data
    tmp = stage(path, lambda f: f.write(raw), mode)
    try:
        commit(tmp, path)
    except OperationError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def stage(path: str, fill: Callable[[BinaryIO], object], mode: int = 0o644) -> str:
    """A new file beside ``path`` that ``fill`` writes, given the old file's metadata
    (as ``write_atomically`` does) and synced: its name, for ``commit`` to put it in
    ``path``'s place, or for the caller to remove. Several files staged first and
    committed after change a folder from one whole set to another."""
    _refuse_special(path, "write")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = _create_beside(directory, mode)
    except OSError as e:
        raise OperationError(f"cannot write {path}: {e.strerror}") from e
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            _keep_metadata(f.fileno(), path)
            os.fsync(f.fileno())
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise OperationError(f"cannot write {path}: {e.strerror}") from e
        raise
    return tmp


def commit(tmp: str, path: str) -> None:
    """The file ``stage`` made put in ``path``'s place (anything there but a regular
    file or a link refused)."""
    _refuse_special(path, "write")
    try:
        os.replace(tmp, path)
    except OSError as e:
        raise OperationError(f"cannot write {path}: {e.strerror}") from e


def _create_beside(directory: str, mode: int) -> tuple[int, str]:
    """A new file in ``directory`` with a name no one else holds (created by this call),
    ``mode`` less the umask as open(2) applies it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = os.path.join(directory, f".pycxl-{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, "no free temporary file name")


_ACL = "system.posix_acl_access"


def _keep_metadata(fd: int, path: str) -> None:
    """Give the new file (``fd``) the mode, owner, group and access ACL of the regular
    file at ``path``, if there is one. The owner first: chown clears set-id bits."""
    try:
        old = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(old.st_mode):
        return  # a link being replaced: its target's metadata is not the file's
    new = os.fstat(fd)
    try:
        if (new.st_uid, new.st_gid) != (old.st_uid, old.st_gid):
            os.fchown(fd, old.st_uid, old.st_gid)
        os.fchmod(fd, stat.S_IMODE(old.st_mode))
    except OSError as e:
        raise OperationError(
            f"cannot write {path}: the new file cannot be given the old one's owner "
            f"{_user(old.st_uid)}:{_group(old.st_gid)} and mode "
            f"{stat.S_IMODE(old.st_mode):04o} ({e.strerror}); run as root, or remove {path} "
            "first"
        ) from e
    try:
        acl = os.getxattr(path, _ACL, follow_symlinks=False)
    except OSError:
        return  # none, or a file system without ACLs
    try:
        os.setxattr(fd, _ACL, acl)
    except OSError as e:
        raise OperationError(
            f"cannot write {path}: the new file cannot be given the old one's ACL "
            f"({e.strerror}); remove {path} first, or its ACL (setfacl -b {path})"
        ) from e


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
