"""Sizes: parsing what people type, printing what people read. One place for both."""

from __future__ import annotations

import numbers
import re

from .errors import InvalidRequestError

_SUFFIX = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
    "t": 1 << 40,
}
# ASCII digits only (re.ASCII): \d would also take other scripts' digits (fullwidth 64K)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE | re.ASCII)
_HEX_RE = re.compile(r"^0x[0-9a-f]+$", re.IGNORECASE | re.ASCII)


def parse_size(text: str | int) -> int:
    """Parse '4096', '0x1000', '4k', '256M', '1.5G', '2GiB' into bytes (binary units);
    whole numbers are bytes. Anything else (1.5, None, True) is an InvalidRequestError."""
    if isinstance(text, bool) or not isinstance(text, str | numbers.Integral):
        raise InvalidRequestError(
            f"size {text!r}: give bytes as a whole number, or a string such as '256M'"
        )
    if isinstance(text, numbers.Integral):
        if text < 0:
            raise InvalidRequestError(f"size {text} is negative")
        return int(text)
    s = text.strip()
    if _HEX_RE.match(s):
        return int(s, 16)
    m = _SIZE_RE.match(s)
    if not m:
        raise InvalidRequestError(
            f"cannot read size '{text}': use bytes or a number with K, M, G or T (e.g. 256M)"
        )
    value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if value != int(value):
        raise InvalidRequestError(f"size '{text}' is not a whole number of bytes")
    return int(value)


def format_size(n: int) -> str:
    """Binary units with two decimals, like ndctl's human sizes: '256.00 MiB'."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.2f} {unit}"
    return f"{n} B"


def format_size_ndctl(n: int) -> str:
    """ndctl's '-u' form: '256.00 MiB (268.44 MB)'."""
    if n < 1 << 10:
        return f"{n}"
    for unit, shift, sunit, p in (
        ("TiB", 40, "TB", 12),
        ("GiB", 30, "GB", 9),
        ("MiB", 20, "MB", 6),
        ("KiB", 10, "KB", 3),
    ):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.2f} {unit} ({n / 10**p:.2f} {sunit})"
    return f"{n}"  # pragma: no cover - loop always returns for n >= 1 KiB
