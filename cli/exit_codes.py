"""The one table from exceptions to exit codes (documented in docs/cli.md)."""

from __future__ import annotations

from pycxl.base.errors import (
    CommandNotExecutableError,
    CommandNotFoundError,
    InvalidRequestError,
    NeedsRootError,
    NotAvailableError,
    NotFoundError,
    PycxlError,
)

OK = 0
FAILED = 1  # an operation was attempted and failed
USAGE = 2  # bad command line or request (click uses 2 too)
NEEDS_ROOT = 3
NOT_AVAILABLE = 4  # hardware, kernel driver or shared library absent
NOT_FOUND = 5  # a named target or object does not exist
CHECK_WARNING = 6  # pycxl check: warnings, no failure
CHECK_FAILURE = 7  # pycxl check: at least one failure
DOES_NOT_FIT = 8  # pycxl plan-train: no placement fits
INTERNAL = 70  # a bug in pycxl (sysexits' EX_SOFTWARE)
NOT_EXECUTABLE = 126  # pycxl run: the command cannot be executed (as a shell says)
COMMAND_NOT_FOUND = 127  # pycxl run: no such command (as a shell says)

_TABLE: tuple[tuple[type[PycxlError], int], ...] = (
    (NeedsRootError, NEEDS_ROOT),
    (NotAvailableError, NOT_AVAILABLE),
    (NotFoundError, NOT_FOUND),
    (InvalidRequestError, USAGE),
    (CommandNotFoundError, COMMAND_NOT_FOUND),
    (CommandNotExecutableError, NOT_EXECUTABLE),
    (PycxlError, FAILED),
)


def exit_code_for(error: PycxlError) -> int:
    for cls, code in _TABLE:
        if isinstance(error, cls):
            return code
    return FAILED  # pragma: no cover - PycxlError is last in the table
