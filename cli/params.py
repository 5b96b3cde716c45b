"""Parameter types: every number, size and list is checked where it is typed, so a bad
value is a usage error (exit 2) naming the option, before anything is measured or
written."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from pycxl.base.errors import InvalidRequestError
from pycxl.base.values import CHASE_MIN_SIZE, MAX_SAMPLES, MAX_SECONDS, PAGE_BYTES, SYSROOT_ENV

if TYPE_CHECKING:  # click 8.2+ types ParamType by the value it returns; older is plain
    IntParam = click.ParamType[int]
    StrParam = click.ParamType[str]
    IntsParam = click.ParamType[tuple[int, ...]]
    NamesParam = click.ParamType[tuple[str, ...]]
    FloatParam = click.ParamType[float]
    FloatsParam = click.ParamType[tuple[float, ...]]
else:
    IntParam = IntsParam = NamesParam = FloatParam = FloatsParam = StrParam = click.ParamType


def _what(param: click.Parameter | None) -> str:
    """What a message calls the value: its parameter's name (samples, count), as the
    library's message would."""
    return param.human_readable_name.lower().replace("_", " ") if param else "the value"


class SizeType(IntParam):
    """Bytes or a number with K, M, G, T (binary units): '4096', '256M', '1.5G'; at
    least ``minimum`` bytes."""

    name = "size"

    def __init__(self, minimum: int = 1) -> None:
        self.minimum = minimum

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from pycxl.base.values import size

        try:  # the library's checker: one message either way
            return size(value if isinstance(value, int) else str(value), None, self.minimum)
        except InvalidRequestError as e:
            self.fail(str(e), param, ctx)


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
        from pycxl.base.values import integer_text, list_items

        try:
            items = list_items(str(value), _what(param), "whole numbers such as 1,2,4")
        except InvalidRequestError as e:
            self.fail(str(e), param, ctx)
        try:
            numbers = [integer_text(v, "item") for v in items]
        except InvalidRequestError:
            self.fail(f"{value!r}: expected whole numbers (digits 0-9) such as 1,2,4", param, ctx)
        low = [n for n in numbers if n < self.minimum]
        if low:
            self.fail(f"{value!r}: {low[0]} is below {self.minimum}", param, ctx)
        return tuple(dict.fromkeys(numbers))  # '1,01' is one number too


class NamesType(NamesParam):
    """Comma-separated names: tier names, node ids and ranges, 'all' (resolved later,
    against the system)."""

    name = "names"

    def __init__(self, metavar: str = "NODES", what: str = "node") -> None:
        self.metavar = metavar
        self.what = what

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return self.metavar

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        from pycxl.base.values import parse_spans
        from pycxl.resolve.tiers import parse_names

        try:  # the library's grammar: empty items refused, repeated names folded
            tokens = parse_names(str(value), self.what)
        except InvalidRequestError as e:  # an unknown name (NotFoundError) is exit 5, as later
            self.fail(str(e), param, ctx)
        for tok in tokens:  # ids and ranges are checked here; names against the system
            if tok.id_list is not None:
                try:
                    parse_spans(tok.id_list)  # its syntax; never expanded here
                except ValueError as e:
                    self.fail(str(e), param, ctx)
        return tuple(t.text for t in tokens)


class ObjectNamesType(NamesParam):
    """Comma-separated names of CXL objects (mem0,mem1; region0; all), each checked
    against the topology later: an empty name, or a list of none (an unset shell
    variable), is refused here rather than read as 'pick for me'."""

    name = "names"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        from pycxl.base.values import ascii_digits, list_items

        try:  # repeats are kept here: flatten folds them, or reports them (positions)
            items = list_items(str(value), "names", "names such as mem0,mem1", fold=False)
            return tuple(ascii_digits(i, "name") for i in items)
        except InvalidRequestError as e:
            self.fail(str(e), param, ctx)


class WeightsType(StrParam):
    """NODE=WEIGHT[,NODE=WEIGHT...] or 'auto': weighted-interleave weights as typed,
    checked for shape here (an empty list, an unset shell variable, would otherwise
    reach the kernel as a change); the names are resolved against the system later."""

    name = "weights"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        if text == "auto":  # words are case-sensitive, as names are
            return "auto"
        from pycxl.base.values import is_digits, list_items

        try:  # a node given twice is refused with the names, later: not folded here
            items = list_items(text, "weights", "NODE=WEIGHT such as dram0=3,cxl0=1, or auto",
                               fold=False)  # fmt: skip
        except InvalidRequestError as e:
            self.fail(str(e), param, ctx)

        for item in items:
            name, sep, weight = item.partition("=")
            if not item or not sep or not name.strip() or not is_digits(weight.strip()):
                self.fail(f"{item!r} in {value!r}: expected NODE=WEIGHT such as cxl0=1, or auto",
                          param, ctx)  # fmt: skip
        return text


class CountType(IntParam):
    """A whole number of at least ``minimum`` (pycxl.base.values.count decides)."""

    name = "count"

    def __init__(self, minimum: int = 1, maximum: int | None = None) -> None:
        self.minimum = minimum
        self.maximum = maximum

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from pycxl.base.values import count, integer_text

        try:
            number = value if isinstance(value, int) else integer_text(str(value), _what(param))
            return count(number, _what(param), self.minimum, self.maximum)
        except InvalidRequestError as e:
            self.fail(str(e), param, ctx)


class IntegerType(IntParam):
    """A whole number of any sign, in ASCII digits (its range is the library's to say:
    an alert threshold)."""

    name = "integer"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from pycxl.base.values import integer_text

        if isinstance(value, int):
            return value
        try:
            return integer_text(str(value), _what(param))
        except InvalidRequestError as e:
            self.fail(str(e), param, ctx)


class FiniteType(FloatParam):
    """A finite number above ``above`` (pycxl.base.values.finite decides): seconds, factors."""

    name = "number"

    def __init__(self, above: float = 0.0, metavar: str = "SECONDS") -> None:
        self.above = above
        self.metavar = metavar

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return self.metavar

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:  # fmt: skip
        from pycxl.base.values import finite, real_text

        try:
            number = value if isinstance(value, float) else real_text(str(value), _what(param))
            return finite(number, _what(param), self.above)
        except InvalidRequestError as e:
            self.fail(str(e), param, ctx)


class ParameterCountType(IntParam):
    """A model's parameter count: 13B, 350M, 7e9 or digits (pycxl.base.values decides)."""

    name = "parameters"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from pycxl.base.values import parameter_count

        try:
            return value if isinstance(value, int) else parameter_count(str(value), _what(param))
        except InvalidRequestError as e:
            self.fail(str(e), param, ctx)


SECONDS = FiniteType()


class PidType(IntParam):
    """A process id (pycxl.base.values.pid decides)."""

    name = "pid"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from pycxl.base.values import pid

        try:
            return pid(value)
        except InvalidRequestError as e:
            self.fail(str(e), param, ctx)


class InputFileType(StrParam):
    """A file pycxl reads (pycxl.base.values.input_file decides); with ``empty_is_off``, an
    empty value turns the input off."""

    name = "file"

    def __init__(self, empty_is_off: bool = False) -> None:
        self.empty_is_off = empty_is_off

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from pycxl.base.values import input_file

        if self.empty_is_off and value == "":
            return ""
        try:
            return input_file(str(value), "file")
        except InvalidRequestError as e:
            self.fail(str(e), param, ctx)


class OutputFileType(StrParam):
    """A file pycxl writes (pycxl.base.outfiles.check_output_path decides), checked before any
    work starts; ``suffixes`` gives the allowed endings, asked only when the option is
    used (the plotting library is slow to import); ``stdout``: '-' is standard output;
    ``appends``: lines are added to the file in place (else it is rewritten)."""

    name = "file"

    def __init__(
        self, suffixes: Callable[[], tuple[str, ...]] | None = None, *, stdout: bool = False,
        appends: bool = False,
    ) -> None:  # fmt: skip
        self.suffixes = suffixes
        self.stdout = stdout
        self.appends = appends

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from pycxl.base.outfiles import check_output_path

        try:
            check_output_path(str(value), "file", self.suffixes() if self.suffixes else (),
                              stdout=self.stdout, appends=self.appends)  # fmt: skip
        except InvalidRequestError as e:
            self.fail(str(e), param, ctx)
        return str(value)


def plot_suffixes() -> tuple[str, ...]:
    """The file endings matplotlib can write here (pgf only with its TeX program)."""
    import shutil

    try:
        import matplotlib
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        from pycxl.base.errors import NotAvailableError

        raise NotAvailableError("--plot needs matplotlib: pip install 'pycxl[plot]'") from None
    kinds = set(FigureCanvasBase.get_supported_filetypes())
    if shutil.which(str(matplotlib.rcParams["pgf.texsystem"])) is None:
        kinds.discard("pgf")
    return tuple(f".{k}" for k in sorted(kinds))


def _check_sysroot(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    import os

    from pycxl.base.values import sysroot

    if value is not None:
        return sysroot(value, "--sysroot")
    env = os.environ.get(SYSROOT_ENV)
    return sysroot(env, SYSROOT_ENV) if env else None


def sysroot_option(help: str | None = None) -> Callable[[Any], Any]:
    """--sysroot DIR (else PYCXL_SYSROOT): a recorded sysfs tree to read instead of this
    machine's; hidden where ``help`` is None. A folder that does not exist is an error
    naming where it came from."""
    return click.option("--sysroot", default=None, metavar="DIR", callback=_check_sysroot,
                        hidden=help is None,
                        help=help and f"{help} (also {SYSROOT_ENV})")  # fmt: skip


# the options of the commands that write to the kernel (region, memdev, port, bus)
WRITES_SYSROOT = sysroot_option(
    "Plan on a recorded sysfs tree instead of this machine (with --dry-run; without it, "
    "the tree's files are written)"
)
DRY_RUN = click.option(
    "--dry-run", is_flag=True, help="Show the plan (the sysfs writes); change nothing."
)
AS_JSON = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")

INTEGER = IntegerType()
MILLISECONDS = CountType(maximum=int(MAX_SECONDS * 1000))
WHOLE_SECONDS = CountType(maximum=int(MAX_SECONDS))
SIZE = SizeType()
PAGE_SIZE = SizeType(minimum=PAGE_BYTES)  # buffers of at least one page
CHASE_SIZE = SizeType(minimum=CHASE_MIN_SIZE)
COUNT = CountType()
PARAMETERS = ParameterCountType()
RATE = FiniteType(metavar="RATE")
SAMPLES = CountType(maximum=MAX_SAMPLES)  # -n/--samples: timed repeats
INT_LIST = IntListType()
NODES = NamesType("NODES")
OBJECT_NAMES = ObjectNamesType()
WEIGHTS = WeightsType()
CPUS = NamesType("CPUS", "CPUs")


def flatten(values: tuple[tuple[str, ...], ...], *, fold: bool = True) -> tuple[str, ...]:
    """A repeated names option's (or argument's) values, as one tuple: a name given
    twice is one, as in one list; ``fold`` False keeps repeats (positions, where one
    named twice is an error to report)."""
    names = [v for group in values for v in group]
    return tuple(dict.fromkeys(names)) if fold else tuple(names)


class RatesType(FloatsParam):
    """Comma-separated bandwidths in GB/s: '5,10,20.5'."""

    name = "rates"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[float, ...]:  # fmt: skip
        if isinstance(value, tuple):
            return value
        from pycxl.base.values import MAX_RATE_GBS, finite, list_items, real_text

        try:
            parts = list_items(str(value), "rates", "GB/s such as 5,10,20.5", fold=False)
        except InvalidRequestError as e:
            self.fail(str(e), param, ctx)
        out: list[float] = []
        for p in parts:  # in GB/s, as typed (the library takes bytes/s)
            try:
                out.append(finite(real_text(p, "rate"), "rate", at_most=MAX_RATE_GBS) * 1e9)
            except InvalidRequestError:
                self.fail(f"rate {p!r} GB/s: give a number of GB/s above 0 and at most "
                          f"{MAX_RATE_GBS:.0f}", param, ctx)  # fmt: skip
        return tuple(dict.fromkeys(out))  # one given twice is one point
