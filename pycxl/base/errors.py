"""The one exception hierarchy of pycxl.

Every error carries a message a person can act on: what failed, why, and what to do.
The CLI maps each class to an exit code (see ``pycxl.cli.exit_codes``).
"""

from __future__ import annotations

from collections.abc import Iterable


class PycxlError(Exception):
    """Root of every error pycxl raises."""


class OperationError(PycxlError):
    """An operation was attempted and failed (exit code 1)."""


class InvalidRequestError(PycxlError):
    """The request is malformed or not allowed; nothing was changed."""


class NeedsRootError(PycxlError):
    """The operation needs root (or CAP_SYS_ADMIN)."""


class NotAvailableError(PycxlError):
    """Hardware, a kernel driver or a shared library is absent."""


class LibraryNotFoundError(NotAvailableError):
    """A shared library could not be loaded."""

    def __init__(self, soname: str, package_hint: str, detail: str = "") -> None:
        self.soname = soname
        self.package_hint = package_hint
        msg = f"{soname} could not be loaded; install {package_hint}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class NotFoundError(PycxlError):
    """A named object (target, memdev, decoder, region, GPU...) does not exist."""

    def __init__(self, kind: str, name: str, known: Iterable[str] = (), problem: str = "",
                 hint: str = "") -> None:  # fmt: skip
        self.kind = kind
        self.name = name
        self.known = sorted(set(known), key=_natural_key)
        near = [k for k in self.known if k.lower() == str(name).lower() and k != name]
        if near:  # names are case-sensitive, as ndctl's and numactl's
            hint = f"did you mean '{near[0]}'? (names are case-sensitive)"
        elif hint:
            pass  # the caller says what to do (there is no list to give)
        elif self.known:
            hint = "known: " + ", ".join(self.known)
        else:
            hint = f"there is no {kind} on this system"
        what = f"unknown {kind} '{name}'" + (f": {problem}" if problem else "")
        super().__init__(f"{what}; {hint}")


class CommandNotFoundError(PycxlError):
    """A command to run does not exist (exit code 127, as a shell says it)."""


class CommandNotExecutableError(PycxlError):
    """A command to run exists but cannot be executed (exit code 126)."""


class SysfsError(OperationError):
    """A kernel attribute file is unreadable or holds a value pycxl cannot parse."""

    def __init__(self, path: str, problem: str, errno: int | None = None) -> None:
        self.path = path
        self.errno = errno  # the kernel's answer to a refused write (EBUSY, EINVAL...)
        super().__init__(f"{path}: {problem}")


class PlacementError(OperationError):
    """Pages are not on the node they were placed on: a long-term pin (GPU registration)
    made the kernel move them, or a policy could not be met. No figure or buffer is
    handed out under the wrong tier's name."""


class CudaError(OperationError):
    """A CUDA driver call returned an error."""

    def __init__(self, call: str, code: int, name: str, text: str) -> None:
        self.call = call
        self.code = code
        super().__init__(f"{call} failed: {name} ({code}): {text}")


class TestbedError(OperationError):
    """The real-kernel testbed could not be prepared or booted."""

    __test__ = False  # not a pytest test class


def _natural_key(name: str) -> tuple[object, ...]:
    """Sort 'mem10' after 'mem9'."""
    import re

    return tuple(int(p) if p.isdecimal() else p for p in re.split(r"(\d+)", name))
