"""The CXL mailbox, through a memdev's character device (``/dev/cxl/memN``), as the
kernel's uapi offers it (``include/uapi/linux/cxl_mem.h``): ``CXL_MEM_QUERY_COMMANDS``
lists the commands the kernel lets user space send to this device, and
``CXL_MEM_SEND_COMMAND`` sends one.

``send`` reads (health, alert configuration, firmware information): a command the
device or kernel does not support is reported as such (``Unsupported``), not raised,
and callers show it and go on. ``call`` sends a command with an input payload (the
label area, alert thresholds, partitions) only after the kernel's own command list says
user space may send it now, and raises an error naming why where it may not.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import stat
import struct
from dataclasses import dataclass

from ..base.errors import NeedsRootError, NotAvailableError, OperationError

# Command ids of the uapi enum (CXL_CMDS order), for the commands pycxl sends.
IDENTIFY = 1
GET_FW_INFO = 4
GET_PARTITION_INFO = 5
GET_LSA = 6
GET_HEALTH_INFO = 7
SET_PARTITION_INFO = 9
SET_LSA = 10
GET_ALERT_CONFIG = 11
SET_ALERT_CONFIG = 12
COMMAND_NAMES = {
    IDENTIFY: "Identify",
    GET_FW_INFO: "Get FW Info",
    GET_PARTITION_INFO: "Get Partition Info",
    GET_LSA: "Get LSA",
    GET_HEALTH_INFO: "Get Health Info",
    SET_PARTITION_INFO: "Set Partition Info",
    SET_LSA: "Set LSA",
    GET_ALERT_CONFIG: "Get Alert Configuration",
    SET_ALERT_CONFIG: "Set Alert Configuration",
}
OUT_SIZE = {GET_FW_INFO: 0x50, GET_HEALTH_INFO: 0x12, GET_ALERT_CONFIG: 0x10,
            IDENTIFY: 0x43, GET_PARTITION_INFO: 0x20}  # fmt: skip
# The query's flags for each command (uapi CXL_MEM_COMMAND_FLAG_*): the device has it,
# and the kernel keeps it to itself (while a driver such as cxl_pmem holds the device)
FLAG_ENABLED = 1 << 0
FLAG_EXCLUSIVE = 1 << 1

_IOC_READ, _IOC_WRITE = 2, 1


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (0xCE << 8) | nr


QUERY_HEADER = struct.Struct("<II")  # n_commands, rsvd
COMMAND_INFO = struct.Struct("<IIII")  # id, flags, size_in, size_out
# id, flags, raw opcode/rsvd, retval, in {size, rsvd, payload}, out {size, rsvd, payload}
SEND_COMMAND = struct.Struct("<IIIIIIQIIQ")
CXL_MEM_QUERY_COMMANDS = _ioc(_IOC_READ, 1, QUERY_HEADER.size)
CXL_MEM_SEND_COMMAND = _ioc(_IOC_READ | _IOC_WRITE, 2, SEND_COMMAND.size)


@dataclass(frozen=True)
class Unsupported:
    """What a memdev could not answer, and why (in words)."""

    command: str
    reason: str


class Mailbox:
    """One memdev's mailbox; ``close()`` (or ``with``) releases the device.

    The path is opened only once it is a character device (not a link, a FIFO, a file,
    a folder) and, where ``device`` gives the memdev's (major, minor) as sysfs says it,
    that very device: an ioctl sent to anything else would reach a device that is not
    this memdev's."""

    def __init__(
        self, memdev: str, dev_dir: str = "/dev/cxl", device: tuple[int, int] | None = None
    ) -> None:
        self.memdev = memdev
        path = os.path.join(dev_dir, memdev)
        self._fd = -1
        try:
            _check_node(path, memdev, device, os.lstat(path))
        except FileNotFoundError:
            raise OperationError(f"{path} does not exist (no devtmpfs or udev?)") from None
        except OSError as e:
            raise OperationError(f"cannot look at {path}, {memdev}'s mailbox: {e.strerror}") from e
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except PermissionError:
            raise NeedsRootError(
                f"the mailbox of {memdev} ({path}) needs root: device health comes from it"
            ) from None
        except FileNotFoundError:
            raise OperationError(f"{path} does not exist (no devtmpfs or udev?)") from None
        except OSError as e:
            raise OperationError(f"cannot open {path}, {memdev}'s mailbox: {e.strerror}") from e
        try:  # what was opened is what was checked (the node may have been swapped)
            _check_node(path, memdev, device, os.fstat(fd))
        except OperationError:
            os.close(fd)
            raise
        self._fd = fd
        self._commands: dict[int, tuple[int, int]] | None = None
        self._flags: dict[int, int] = {}

    def commands(self) -> dict[int, tuple[int, int]]:
        """Command id -> (input size, output size) of what the kernel lets user space send."""
        if self._commands is None:
            head = bytearray(QUERY_HEADER.size)
            fcntl.ioctl(self._fd, CXL_MEM_QUERY_COMMANDS, head)
            (count, _) = QUERY_HEADER.unpack(head)
            buf = bytearray(QUERY_HEADER.pack(count, 0) + bytes(COMMAND_INFO.size * count))
            fcntl.ioctl(self._fd, CXL_MEM_QUERY_COMMANDS, buf)
            self._commands = {}
            for i in range(count):
                cid, _flags, size_in, size_out = COMMAND_INFO.unpack_from(
                    buf, QUERY_HEADER.size + i * COMMAND_INFO.size
                )
                self._commands[cid] = (size_in, size_out)
                self._flags[cid] = _flags
        return self._commands

    def refusal(self, command: int) -> str | None:
        """Why the kernel would not pass ``command`` to this device now (None: it would)."""
        if command not in self.commands():
            return "this kernel does not offer it to user space"
        flags = self._flags.get(command, 0)
        # kernels that mark enabled commands (6.x) mark some; older ones mark none
        marked = any(f & FLAG_ENABLED for f in self._flags.values())
        if marked and not flags & FLAG_ENABLED:
            return "the device does not support it (not in its command effects log)"
        if flags & FLAG_EXCLUSIVE:
            return ("the kernel holds it for its own use while a driver (cxl_pmem's nvdimm) "
                    "has the device; disable that first")  # fmt: skip
        return None

    def check_allowed(self, command: int) -> None:
        """Raise ``NotAvailableError`` naming why the kernel would not send ``command``."""
        why = self.refusal(command)
        if why is not None:
            name = COMMAND_NAMES.get(command, f"command {command}")
            raise NotAvailableError(f"{name} on {self.memdev}: {why}")

    def call(self, command: int, payload: bytes = b"", out_size: int = 0) -> bytes:
        """Send ``command`` with ``payload``; its output (up to ``out_size`` bytes). Raises
        ``NotAvailableError`` where the kernel or device has no such command, and
        ``OperationError`` naming the mailbox status where the device refuses it."""
        name = COMMAND_NAMES.get(command, f"command {command}")
        self.check_allowed(command)
        inbuf = ctypes.create_string_buffer(payload, max(len(payload), 1))
        out = ctypes.create_string_buffer(max(out_size, 1))
        cmd = bytearray(SEND_COMMAND.pack(command, 0, 0, 0, len(payload), 0,
                                          ctypes.addressof(inbuf) if payload else 0,
                                          out_size, 0,
                                          ctypes.addressof(out) if out_size else 0))  # fmt: skip
        try:
            fcntl.ioctl(self._fd, CXL_MEM_SEND_COMMAND, cmd)
        except OSError as e:
            raise _send_error(name, self.memdev, e) from None
        fields = SEND_COMMAND.unpack(cmd)
        retval, got = fields[3], fields[7]
        if retval != 0:
            status = MAILBOX_STATUS.get(retval, "see the CXL specification's return codes")
            raise OperationError(f"{name} on {self.memdev}: the device answered mailbox "
                                 f"status {retval} ({status})")  # fmt: skip
        return out.raw[: min(got, out_size)]

    def send(self, command: int) -> bytes | Unsupported:
        """The output payload of a command without input, or why there is none."""
        name = COMMAND_NAMES.get(command, f"command {command}")
        if command not in self.commands():
            return Unsupported(name, "the kernel does not offer it to user space here")
        size = OUT_SIZE[command]
        out = ctypes.create_string_buffer(size)
        cmd = bytearray(SEND_COMMAND.pack(command, 0, 0, 0, 0, 0, 0, size, 0,
                                          ctypes.addressof(out)))  # fmt: skip
        try:
            fcntl.ioctl(self._fd, CXL_MEM_SEND_COMMAND, cmd)
        except OSError as e:
            if e.errno == errno.ENOTTY:  # the kernel's answer for commands not enabled
                return Unsupported(name, "the device does not support it (not in its "
                                         "command effects log)")  # fmt: skip
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENXIO):
                return Unsupported(name, f"refused by the kernel ({os.strerror(e.errno)})")
            if e.errno == errno.EPERM:
                raise NeedsRootError(f"{name} on {self.memdev} needs root") from None
            raise OperationError(f"{name} on {self.memdev} failed: {e.strerror}") from e
        fields = SEND_COMMAND.unpack(cmd)
        retval, out_size = fields[3], fields[7]
        if retval != 0:
            return Unsupported(name, f"the device answered with mailbox status {retval}")
        return out.raw[: min(out_size, size)]

    def close(self) -> None:
        """Release the device."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Mailbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_node(path: str, memdev: str, device: tuple[int, int] | None,
                st: os.stat_result) -> None:  # fmt: skip
    """Raise ``OperationError`` unless ``st`` (of ``path``) is a character device, and
    ``device``'s where it is given."""
    numbers = f"{device[0]} {device[1]}" if device else "MAJOR MINOR"
    fix = (f"replace it with the device node (mknod {path} c {numbers}: the numbers in "
           f"/sys/bus/cxl/devices/{memdev}/dev)")  # fmt: skip
    if not stat.S_ISCHR(st.st_mode):
        kind = next((w for test, w in _KINDS if test(st.st_mode)), "not a device node")
        raise OperationError(f"{path} is {kind}, not {memdev}'s character device: {fix}")
    if device is not None and (os.major(st.st_rdev), os.minor(st.st_rdev)) != device:
        raise OperationError(
            f"{path} is device {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}, but {memdev} is "
            f"{device[0]}:{device[1]} (its sysfs dev): {fix}"
        )


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISREG, "a regular file"))  # fmt: skip


# Mailbox return codes (CXL 3.1 table 8-34) a person can act on
MAILBOX_STATUS = {
    1: "background command started",
    2: "invalid input",
    3: "unsupported",
    4: "internal error",
    5: "retry required",
    6: "busy",
    7: "media disabled",
    8: "firmware transfer in progress",
    9: "firmware transfer out of order",
    10: "firmware verification failed",
    11: "invalid firmware slot",
    12: "activation failed, firmware rolled back",
    13: "activation failed, cold reset required",
    14: "invalid handle",
    15: "invalid physical address",
    16: "inject poison limit reached",
    17: "permanent media failure",
    18: "aborted",
    19: "invalid security state",
    20: "incorrect passphrase",
    21: "unsupported mailbox or CCI",
    22: "invalid payload length",
}


def _send_error(name: str, memdev: str, e: OSError) -> Exception:
    """The kernel's refusal of a command, in words."""
    if e.errno == errno.EPERM:
        return NeedsRootError(f"{name} on {memdev} needs root")
    if e.errno == errno.ENOTTY:
        return NotAvailableError(f"{name} on {memdev}: the device does not support it")
    if e.errno == errno.EBUSY:
        return OperationError(f"{name} on {memdev}: the kernel refused it as busy (it holds "
                              "the command for a driver, or refuses this payload)")  # fmt: skip
    return OperationError(f"{name} on {memdev} failed: {os.strerror(e.errno or 0)}")
