"""The one table from exceptions to exit codes (documented in docs/cli.md)."""

from __future__ import annotations

from pycxl.errors import (
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

_TABLE: tuple[tuple[type[PycxlError], int], ...] = (
    (NeedsRootError, NEEDS_ROOT),
    (NotAvailableError, NOT_AVAILABLE),
    (NotFoundError, NOT_FOUND),
    (InvalidRequestError, USAGE),
    (PycxlError, FAILED),
)


def exit_code_for(error: PycxlError) -> int:
    for cls, code in _TABLE:
        if isinstance(error, cls):
            return code
    return FAILED  # pragma: no cover - PycxlError is last in the table
