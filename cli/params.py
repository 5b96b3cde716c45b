"""Parameter types: every number, size and list is checked where it is typed, so a bad
value is a usage error (exit 2) naming the option, before anything is measured or
written."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from pycxl.errors import InvalidRequestError
from pycxl.units import format_size, parse_size

if TYPE_CHECKING:  # click 8.2+ types ParamType by the value it returns; older is plain
    IntParam = click.ParamType[int]
    IntsParam = click.ParamType[tuple[int, ...]]
    NamesParam = click.ParamType[tuple[str, ...]]
    FloatParam = click.ParamType[float]
    FloatsParam = click.ParamType[tuple[float, ...]]
else:
    IntParam = IntsParam = NamesParam = FloatParam = FloatsParam = click.ParamType


class SizeType(IntParam):
    """Bytes or a number with K, M, G, T (binary units): '4096', '256M', '1.5G'; at
    least ``minimum`` bytes."""

    name = "size"

    def __init__(self, minimum: int = 1) -> None:
        self.minimum = minimum

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            n = value
        else:
            try:
                n = parse_size(str(value))
            except InvalidRequestError as e:
                self.fail(str(e), param, ctx)
        if n < self.minimum:
            least = format_size(self.minimum) if self.minimum >= 1024 else f"{self.minimum} B"
            self.fail(f"{value!r} is too small: give at least {least}", param, ctx)
        return n


class IntListType(IntsParam):
    """Comma-separated whole numbers, each at least ``minimum``: '1,2,4'."""

    name = "list"

    def __init__(self, minimum: int = 1) -> None:
        self.minimum = minimum

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "N[,N...]"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        items = [v.strip() for v in str(value).split(",")]
        if not all(v.lstrip("-").isdigit() for v in items):
            self.fail(f"{value!r}: expected whole numbers such as 1,2,4", param, ctx)
        numbers = tuple(int(v) for v in items)
        low = [n for n in numbers if n < self.minimum]
        if low:
            self.fail(f"{value!r}: {low[0]} is below {self.minimum}", param, ctx)
        return numbers


class NamesType(NamesParam):
    """Comma-separated names: tier names, node ids and ranges, 'all' (resolved later,
    against the system)."""

    name = "names"

    def __init__(self, metavar: str = "NODES") -> None:
        self.metavar = metavar

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return self.metavar

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        items = [v.strip() for v in str(value).replace(" ", ",").split(",") if v.strip()]
        if not items:
            self.fail("expected at least one name, such as dram0 or 0-1", param, ctx)
        return tuple(items)


SIZE = SizeType()
PAGE_SIZE = SizeType(minimum=4096)  # buffers of at least one page
COUNT = click.IntRange(min=1)
SECONDS = click.IntRange(min=1)  # a whole number of seconds: a lifetime, a timeout
INT_LIST = IntListType()
NODES = NamesType("NODES")
CPUS = NamesType("CPUS")


def flatten(values: tuple[tuple[str, ...], ...]) -> tuple[str, ...]:
    """A repeated NamesType option's values, as one tuple."""
    return tuple(v for group in values for v in group)


class RatesType(FloatsParam):
    """Comma-separated bandwidths in GB/s: '5,10,20.5'."""

    name = "rates"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[float, ...]:  # fmt: skip
        if isinstance(value, tuple):
            return value
        out = []
        for part in str(value).split(","):
            try:
                gbs = float(part)
            except ValueError:
                self.fail(f"{part!r} is not a bandwidth in GB/s", param, ctx)
            if not gbs > 0 or gbs != gbs or gbs == float("inf"):
                self.fail(f"{part!r}: a bandwidth is above 0 GB/s", param, ctx)
            out.append(gbs * 1e9)
        return tuple(out)
