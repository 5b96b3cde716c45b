"""The only code that reads or writes kernel attribute files (/sys, /proc).

Every path is relative to a *sysroot*: '/' on a live system, a recorded tree in tests.
The sysroot comes from the argument, else ``PYCXL_SYSROOT``, else '/'; one that does not
exist, or holds no sysfs tree, is an error (``pycxl.base.values.sysroot``), never an empty
system. A recorded tree never reaches outside itself: an attribute or folder that is a
link out of it, or an attribute that is not a plain file, is an error, never read,
listed or written through.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import time
from collections.abc import Iterator
from typing import Literal

from .errors import NeedsRootError, SysfsError
from .values import SYSROOT_ENV, parse_ranges, sysroot

Want = Literal["read", "write", "list"]  # what a recorded tree's path is checked for


class Sysfs:
    """Typed access to attribute files under one sysroot."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        if root is None:
            env = os.environ.get(SYSROOT_ENV)
            self.root = sysroot(env, SYSROOT_ENV) if env else "/"
        else:
            self.root = sysroot(root)
        self._top = os.path.realpath(self.root)  # the tree's own folder, links resolved
        self._real_folders: dict[str, str] = {}  # a tree's folders, links resolved

    def __repr__(self) -> str:
        return f"Sysfs({self.root!r})"

    # --- paths -------------------------------------------------------------
    def path(self, rel: str) -> str:
        """Absolute path on this machine of a kernel path such as '/sys/bus/cxl'."""
        return os.path.join(self.root, rel.lstrip("/"))

    def rel(self, abspath: str) -> str:
        """Inverse of path(): '/sys/...' for an absolute path inside the sysroot."""
        r = os.path.relpath(abspath, self.root)
        return "/" + r if r != "." else "/"

    def exists(self, rel: str) -> bool:
        """Whether a kernel path exists under the sysroot."""
        return os.path.exists(self.path(rel))

    def is_dir(self, rel: str) -> bool:
        """Whether a kernel path is a directory under the sysroot."""
        return os.path.isdir(self.path(rel))

    def listdir(self, rel: str) -> list[str]:
        """Entries of a directory, sorted; [] when it does not exist."""
        try:
            if self.root != "/":
                self._require_in_tree(rel, want="list")
            return sorted(os.listdir(self.path(rel)))
        except FileNotFoundError:
            return []
        except NotADirectoryError:
            return []
        except PermissionError as e:
            raise SysfsError(rel, f"cannot list ({e.strerror}); run as root") from e

    def realpath(self, rel: str) -> str:
        """Resolve links; returns a kernel path ('/sys/devices/...')."""
        return self.rel(os.path.realpath(self.path(rel)))

    def link_target_name(self, rel: str) -> str | None:
        """Basename of what a symlink points to, or None when it is not there."""
        try:
            return os.path.basename(os.readlink(self.path(rel)).rstrip("/"))
        except (FileNotFoundError, OSError):
            return None

    # --- reads -------------------------------------------------------------
    def read(self, rel: str, *, root_only: bool = False) -> str | None:
        """Contents of an attribute without the trailing newline; None when absent.
        ``root_only``: an attribute the kernel shows only to root (physical addresses);
        None, not an error, for anyone else."""
        try:
            if self.root != "/":
                self._require_in_tree(rel)
            with open(self.path(rel), encoding="utf-8", errors="replace") as f:
                return f.read().rstrip("\n")
        except FileNotFoundError:
            return None
        except IsADirectoryError as e:
            raise SysfsError(rel, "is a directory, expected an attribute file") from e
        except PermissionError as e:
            if root_only:
                return None
            if os.geteuid() != 0:
                raise NeedsRootError(f"{rel}: permission denied; run as root to read it") from e
            raise SysfsError(rel, "permission denied, even to root", e.errno) from e
        except OSError as e:
            # Some attributes fail to read on purpose (ENXIO, EINVAL) when they do
            # not apply to the object's current state: treat them as absent.
            if e.errno in (errno.ENXIO, errno.EINVAL, errno.EOPNOTSUPP, errno.ENODEV):
                return None
            raise SysfsError(rel, f"cannot read ({e.strerror})") from e

    def read_bytes(self, rel: str) -> bytes | None:
        """A binary attribute as the kernel gives this user (a PCI device's ``config``:
        all of it to root, its first 64 bytes to anyone else); None when absent."""
        try:
            if self.root != "/":
                self._require_in_tree(rel)
            with open(self.path(rel), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except IsADirectoryError as e:
            raise SysfsError(rel, "is a directory, expected an attribute file") from e
        except PermissionError as e:
            raise NeedsRootError(f"{rel}: permission denied; run as root to read it") from e
        except OSError as e:
            raise SysfsError(rel, f"cannot read ({e.strerror})") from e

    def _require_in_tree(self, rel: str, *, want: Want = "read") -> None:
        """A recorded tree's attribute is a plain file inside it: a link out of the tree
        would reach this machine's /sys, a FIFO block the read, a device node never end
        it (the kernel's own attributes are all regular). ``want``: 'read' (a file or a
        folder; FileNotFoundError where absent), 'write' (a file, or absent: the write
        creates it), 'list' (only inside the tree)."""
        real = self._resolved(self.path(rel))
        if os.path.commonpath([real, self._top]) != self._top:
            raise SysfsError(rel, f"leads out of the recorded tree {self.root} (to {real})")
        if want == "list":
            return
        try:
            mode = os.stat(real).st_mode
        except FileNotFoundError:
            if want == "write":
                return
            raise
        if not stat.S_ISREG(mode) and (want == "write" or not stat.S_ISDIR(mode)):
            raise SysfsError(rel, "is not a regular file in this recorded tree")

    def _resolved(self, path: str) -> str:
        """``path`` with every link resolved: its folder's once a command (a recorded
        tree's folders do not move; os.path.realpath costs more than the read), its own
        where it is a link."""
        folder, name = os.path.split(path)
        real_folder = self._real_folders.get(folder)
        if real_folder is None:
            real_folder = self._real_folders[folder] = os.path.realpath(folder)
        joined = os.path.join(real_folder, name)
        try:
            if not stat.S_ISLNK(os.lstat(joined).st_mode):
                return joined
        except OSError:
            return joined
        return os.path.realpath(joined)

    def check_in_tree(self, rel: str) -> None:
        """Raise ``SysfsError`` where ``rel``, under a recorded tree, leads out of it or
        is there and not a plain file (this machine's own tree is never refused)."""
        if self.root != "/":
            self._require_in_tree(rel, want="write")

    def read_int(self, rel: str, *, root_only: bool = False) -> int | None:
        """An integer attribute in decimal or 0x-hex; None when absent or empty (and,
        with ``root_only``, when only root may read it)."""
        text = self.read(rel, root_only=root_only)
        if text is None or text.strip() == "":
            return None
        s = text.strip()
        try:
            return int(s, 16) if s.lower().startswith("0x") else int(s, 10)
        except ValueError:
            raise SysfsError(rel, f"expected an integer, found {s!r}") from None

    def read_bool(self, rel: str) -> bool | None:
        """A 0/1 attribute as a bool; None when absent."""
        v = self.read_int(rel)
        return None if v is None else v != 0

    def read_int_list(self, rel: str) -> tuple[int, ...] | None:
        """A comma- or space-separated list of integers ('12,222' or '10 20')."""
        text = self.read(rel)
        if text is None:
            return None
        parts = [p for p in text.replace(",", " ").split() if p]
        try:
            return tuple(int(p, 0) for p in parts)
        except ValueError:
            raise SysfsError(rel, f"expected a list of integers, found {text!r}") from None

    def read_cpulist(self, rel: str) -> tuple[int, ...] | None:
        """A kernel cpulist ('0-3,8,10-11')."""
        text = self.read(rel)
        if text is None:
            return None
        try:
            return parse_cpulist(text)
        except ValueError:
            raise SysfsError(rel, f"expected a CPU list such as '0-3,8', found {text!r}") from None

    def iter_lines(self, rel: str) -> Iterator[str]:
        """The lines of an attribute (none when absent)."""
        text = self.read(rel)
        if text is not None:
            yield from text.splitlines()

    # --- writes ------------------------------------------------------------
    def write(self, rel: str, value: str, *, timeout: float | None = None) -> None:
        """Write one attribute; turns errno into an error naming the file.

        With ``timeout``, the write runs in a child process that is killed (SIGKILL) if
        it has not returned by then: some writes block in the kernel until a fatal
        signal (offlining memory whose pages cannot move retries forever), and only a
        fatal signal makes the kernel give up, leaving the attribute as it was."""
        if self.root != "/":
            self._require_in_tree(rel, want="write")
        if timeout is not None:
            self._write_bounded(rel, value, timeout)
            return
        p = self.path(rel)
        try:
            with open(p, "w", encoding="utf-8") as f:
                f.write(value)
        except PermissionError as e:
            if os.geteuid() != 0:
                raise NeedsRootError(f"writing {rel} needs root; run with sudo") from e
            raise SysfsError(rel, f"write of {value!r} refused ({e.strerror})", e.errno) from e
        except OSError as e:
            raise SysfsError(rel, f"write of {value!r} failed ({e.strerror})", e.errno) from e

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a binary attribute (a firmware loader's ``data``) in one go."""
        if self.root != "/":
            self._require_in_tree(rel, want="write")
        try:
            with open(self.path(rel), "wb") as f:
                f.write(data)
        except PermissionError as e:
            if os.geteuid() != 0:
                raise NeedsRootError(f"writing {rel} needs root; run with sudo") from e
            raise SysfsError(rel, f"write of {len(data)} bytes refused ({e.strerror})",
                             e.errno) from e  # fmt: skip
        except OSError as e:
            raise SysfsError(rel, f"write of {len(data)} bytes failed ({e.strerror})",
                             e.errno) from e  # fmt: skip

    def _write_bounded(self, rel: str, value: str, timeout: float) -> None:
        p = self.path(rel)
        pid = os.fork()
        if pid == 0:  # child: write, report the errno as the exit status
            code = 0
            try:
                fd = os.open(p, os.O_WRONLY)
                try:
                    os.write(fd, value.encode())
                finally:
                    os.close(fd)
            except OSError as e:
                code = e.errno or 1
            os._exit(code)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise SysfsError(
                    rel,
                    f"write of {value!r} did not finish within {timeout:.0f} s",
                    errno.ETIMEDOUT,
                )
            time.sleep(0.05)
        code = os.waitstatus_to_exitcode(status)
        if code == errno.EACCES and os.geteuid() != 0:
            raise NeedsRootError(f"writing {rel} needs root; run with sudo")
        if code:
            raise SysfsError(rel, f"write of {value!r} failed ({os.strerror(code)})", code)


# Linux's largest NR_CPUS (CONFIG_MAXSMP) is 8192 and MAX_NUMNODES 1024: a list the kernel
# writes has no id beyond these (one read from a recorded tree may, and is refused before
# it is expanded)
KERNEL_ID_LIMIT = 1 << 16


def parse_cpulist(text: str) -> tuple[int, ...]:
    """A kernel CPU or node list ('0-3,8') as a tuple of ids (ValueError if malformed)."""
    return parse_ranges(text, limit=KERNEL_ID_LIMIT)
