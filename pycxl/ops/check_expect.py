"""What a job needs of the host, as ``pycxl check --expect`` takes it: ``cxl0=512G``,
``regions=2``, ``memdevs=4``, given one by one or in a file."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..base.errors import InvalidRequestError
from ..base.units import parse_size
from ..base.values import is_digits, read_text
from ..resolve.tiers import token

_EXPECT = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*=\s*(\S+)\s*$")
_COUNTS = ("regions", "memdevs")


@dataclass(frozen=True)
class Expectations:
    """What the job needs: node capacities by name, and counts of regions and memdevs."""

    capacities: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """No expectation given: check consistency only."""
        return not self.capacities and not self.counts


def parse_expectations(items: Iterable[str], source: str = "--expect") -> Expectations:
    """``cxl0=512G``, ``regions=2``, ``memdevs=4``: InvalidRequestError names a bad one."""
    caps: dict[str, int] = {}
    counts: dict[str, int] = {}
    given: dict[str, str] = {}  # each name's item: one given twice is one, unless they differ
    for item in items:
        m = _EXPECT.match(item)
        if not m:
            raise InvalidRequestError(
                f"{source} {item!r}: write NAME=SIZE (cxl0=512G), regions=N or memdevs=N"
            )
        key, value = m.group(1), m.group(2)
        if key in given and given[key] != item.strip():
            raise InvalidRequestError(
                f"{source} {item!r}: {key} is also expected as {given[key]!r}; give it once"
            )
        given[key] = item.strip()
        if key in _COUNTS:
            if not is_digits(value):
                raise InvalidRequestError(f"{source} {item!r}: {key} takes a whole number")
            counts[key] = int(value)
            continue
        if token(key).kind not in ("dram", "cxl", "node"):  # names as typed: lower case
            raise InvalidRequestError(
                f"{source} {item!r}: {key} is not a memory node name (dram0, cxl0, node2) "
                "nor regions/memdevs"
            )
        try:
            caps[key] = parse_size(value)
        except InvalidRequestError as e:
            raise InvalidRequestError(f"{source} {item!r}: {e}") from None
    return Expectations(caps, counts)


def read_expect_file(path: str) -> list[str]:
    """The expectations in a file: one per line, '#' starts a comment."""
    lines = read_text(path, "expectation file").splitlines()
    return [ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip()]
