"""The CXL mailbox, through a memdev's character device (``/dev/cxl/memN``), as the
kernel's uapi offers it (``include/uapi/linux/cxl_mem.h``): ``CXL_MEM_QUERY_COMMANDS``
lists the commands the kernel lets user space send to this device, and
``CXL_MEM_SEND_COMMAND`` sends one.

Only read-only commands are used here (health, alert configuration, firmware
information). A command the device or kernel does not support is reported as such
(``Unsupported``), not raised: callers show it and go on.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from dataclasses import dataclass

from ..errors import NeedsRootError, OperationError

# Command ids of the uapi enum (CXL_CMDS order), for the commands pycxl sends.
GET_FW_INFO = 4
GET_HEALTH_INFO = 7
GET_ALERT_CONFIG = 11
COMMAND_NAMES = {
    GET_FW_INFO: "Get FW Info",
    GET_HEALTH_INFO: "Get Health Info",
    GET_ALERT_CONFIG: "Get Alert Configuration",
}
OUT_SIZE = {GET_FW_INFO: 0x50, GET_HEALTH_INFO: 0x12, GET_ALERT_CONFIG: 0x10}

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
    """One memdev's mailbox; ``close()`` (or ``with``) releases the device."""

    def __init__(self, memdev: str, dev_dir: str = "/dev/cxl") -> None:
        self.memdev = memdev
        path = os.path.join(dev_dir, memdev)
        try:
            self._fd = os.open(path, os.O_RDWR)
        except PermissionError:
            raise NeedsRootError(
                f"the mailbox of {memdev} ({path}) needs root: device health comes from it"
            ) from None
        except FileNotFoundError:
            raise OperationError(f"{path} does not exist (no devtmpfs or udev?)") from None
        self._commands: dict[int, tuple[int, int]] | None = None

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
        return self._commands

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
