"""What people type, checked where it comes in: sizes, whole-number counts, samples,
page sizes, interleave ways and granularity, id lists and ranges, process ids, files to
read and the sysroot.

Each kind of value has one checker, which the command line's parameter types and the
library's public functions both call, so a bad value gets the same message either way
and the floors below take typed values without checking them again (they keep only
physical limits). Sizes are read by ``pycxl.base.units.parse_size``; tier names by
``pycxl.resolve.tiers``; files pycxl writes by ``pycxl.base.outfiles``. Every refusal is an
``InvalidRequestError`` naming the value.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Iterable
from typing import Literal, TypeVar

from .errors import InvalidRequestError
from .units import format_size, parse_size

T = TypeVar("T")
SYSROOT_ENV = "PYCXL_SYSROOT"
# A device's capacity, and a region made of it (``region create --type``): volatile (ram:
# it becomes a NUMA node) or persistent (pmem: it keeps its data and labels)
PartitionMode = Literal["ram", "pmem"]
RAM: PartitionMode = "ram"
PMEM: PartitionMode = "pmem"
PARTITION_MODES: tuple[PartitionMode, ...] = (RAM, PMEM)
# interleave ways a CXL decoder can take (CXL 3.x: 1, 2, 4, 8, 16, and 3, 6, 12)
VALID_WAYS = (1, 2, 3, 4, 6, 8, 12, 16)

# the smallest arena a pointer chase can randomise (CPU or GPU)
CHASE_MIN_SIZE = 16 << 10
# a buffer of at least one page
PAGE_BYTES = 4096
# the page sizes a measurement can ask for
PAGE_SIZES = ("4k", "2m")

# the modes whose regions become memory the host runs on (dax device -> NUMA node); the
# others keep data, so destroying them needs --force
VOLATILE_MODES: frozenset[PartitionMode] = frozenset({RAM})


# Numbers are typed in ASCII digits, as numactl, head and the kernel read them: Python's
# int() and float() (and str.isdecimal) also take Arabic-Indic, fullwidth or Devanagari
# digits, underscores, '+' and blanks, which no other tool here does
_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)
_REAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)
_HEX = re.compile(r"0[xX][0-9a-fA-F]+", re.ASCII)
ASCII_HINT = "digits 0-9"


def is_digits(text: object) -> bool:
    """Whether ``text`` is one or more ASCII digits, and nothing else (no sign, blank,
    underscore or other script's digit): an id, a node, a CPU, a threshold."""
    return isinstance(text, str) and _DIGITS.fullmatch(text) is not None


def is_hex(text: object) -> bool:
    """Whether ``text`` is 0x and ASCII hex digits (a serial, an address)."""
    return isinstance(text, str) and _HEX.fullmatch(text) is not None


def ascii_digits(text: str, what: str) -> str:
    """A name or id whose digits are all ASCII: one with an Arabic-Indic or fullwidth
    digit names nothing, and is refused as mistyped rather than looked up."""
    bad = next((c for c in text if c.isnumeric() and not c.isascii()), None)
    if bad is not None:
        raise InvalidRequestError(f"{what} {text!r}: {bad!r} is not one of the {ASCII_HINT}; "
                                  "write numbers and ids in ASCII digits")  # fmt: skip
    return text


def serial(text: object, what: str = "serial") -> str:
    """A memdev serial number as typed: ASCII decimal, or 0x and hex digits."""
    if not (is_digits(text) or is_hex(text)):
        raise InvalidRequestError(f"{what} {text!r}: give a serial number such as 0x1f or 31 "
                                  f"({ASCII_HINT}, or 0x and hex digits)")  # fmt: skip
    return str(text)


def integer_text(text: str, what: str) -> int:
    """A whole number as typed: ASCII digits, a leading '-' allowed (its range is the
    caller's to say)."""
    if _INTEGER.fullmatch(text) is None:
        raise InvalidRequestError(f"{what} {text!r} is not a whole number: give {ASCII_HINT}")
    return int(text)


def address_text(text: str, what: str) -> int:
    """An address or offset as typed: ASCII decimal digits, or 0x and hex digits."""
    if is_digits(text):
        return int(text)
    if is_hex(text):
        return int(text, 16)
    raise InvalidRequestError(f"{what} {text!r} is not a number: give {ASCII_HINT}, or 0x and "
                              "hex digits, such as 0x1000")  # fmt: skip


def real_text(text: str, what: str) -> float:
    """A number as typed: ASCII digits with an optional fraction and exponent ('0.5',
    '2e-3'), a leading '-' allowed; 'nan' and 'inf' are read, for ``finite`` to refuse."""
    if text.lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return float(text)
    if _REAL.fullmatch(text) is None:
        raise InvalidRequestError(f"{what} {text!r} is not a number: give {ASCII_HINT} (0.5)")
    return float(text)


def flag(value: object, what: str) -> bool:
    """A yes/no option: True or False, never a truthy stand-in."""
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{what} {value!r}: give True or False")
    return value


def count(value: object, what: str, minimum: int = 1, maximum: int | None = None) -> int:
    """A whole number of at least ``minimum`` (samples, threads, steps), and at most
    ``maximum`` where one is given: ints only, so ``1.5``, ``True`` or ``"3"`` are refused
    rather than rounded or read."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidRequestError(f"{what} {value!r}: give a whole number of at least {minimum}")
    n = int(value)
    if n < minimum:
        raise InvalidRequestError(f"{what} must be at least {minimum}, not {n}")
    if maximum is not None and n > maximum:
        raise InvalidRequestError(f"{what} must be at most {maximum}, not {n}")
    return n


MAX_PARAMETERS = 10**15  # far past any model one box trains
_MODEL_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parameter_count(text: str, what: str = "parameters") -> int:
    """A model's parameter count as people write it: ``13B``, ``1.1B``, ``350M``, ``7e9``
    or digits (K, M, B or G, T: powers of 1000)."""
    body = text.strip()
    scale = _MODEL_SCALE.get(body[-1:].upper(), 0) if body and body[-1].isalpha() else 1
    if scale:
        body = body[:-1] if body[-1:].isalpha() else body
    if not scale or _REAL.fullmatch(body) is None or body.startswith("-"):
        raise InvalidRequestError(f"{what} {text!r}: give a count such as 13B, 350M or 7000000000")
    value = float(body) * scale
    if not 1 <= value <= MAX_PARAMETERS:
        raise InvalidRequestError(f"{what} {text!r}: give a count from 1 to {MAX_PARAMETERS:.0e}")
    n = round(value)
    return n


def lookahead(value: object) -> int:
    """How many blocks (layers) a ring copies ahead of the one in use, for every ring:
    0 (each copied as it is needed, nothing ahead) up to MAX_LAYERS."""
    return count(value, "lookahead", 0, MAX_LAYERS)


def size(value: object, what: str | None = "size", minimum: int = 1) -> int:
    """Bytes: an int, or text such as '4096', '256M', '1.5G' (``units.parse_size``), of
    at least ``minimum``. ``what`` None: the message leaves the name out, for a
    command-line option that names itself."""
    n = parse_size(value)  # type: ignore[arg-type]  # parse_size refuses other types itself
    if n >= minimum:
        return n
    if what is not None and minimum <= 1:
        raise InvalidRequestError(f"{what} must be positive, not {value!r}")
    if what is None:  # as the other options' messages print sizes
        least = format_size(minimum) if minimum >= 1024 else f"{minimum} B"
        raise InvalidRequestError(f"{value!r} is too small: give at least {least}")
    least = f"{minimum >> 10} KiB" if minimum >= 1024 and not minimum % 1024 else f"{minimum} B"
    raise InvalidRequestError(f"{what} {value!r} is too small: give at least {least}")


def optional_size(value: object, what: str = "size", minimum: int = 1) -> int | None:
    """``size`` where None means the default."""
    return None if value is None else size(value, what, minimum)


# The most timed repeats of one measurement (-n/--samples): each repeat is a whole pass
# over the arena, and STREAM and MLC take ten or so
MAX_SAMPLES = 1000
# dependent loads per latency sample (the library's ``loads``): the default is 4M; a
# billion takes minutes a sample on CXL memory
MAX_LOADS = 1 << 30


def samples(value: object) -> int | None:
    """Timed samples, passes or copies: None (the measurement's default) or a count of
    at most ``MAX_SAMPLES``."""
    return None if value is None else count(value, "samples", 1, MAX_SAMPLES)


def page_size(value: object) -> str:
    """A page size name: '4k' or '2m' (whether 2 MiB pages are available is the
    machine's to say, when the buffer is made)."""
    return word(value, "page size", PAGE_SIZES)


def ways(value: object) -> int:
    """Interleave ways a CXL decoder can take (``VALID_WAYS``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidRequestError(f"ways {value!r}: give a whole number")
    if int(value) not in VALID_WAYS:
        raise InvalidRequestError(
            f"interleave ways {value} is not one CXL supports; use one of "
            + ", ".join(map(str, VALID_WAYS))
        )
    return int(value)


MAX_STEPS = 1000  # points of one loaded-latency sweep
# the offload benchmark's stack (bench offload): its weights are layers x width^2 bf16
# values on the GPU and on each tier; these keep every buffer's size a 64-bit count
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 17
MAX_TOKENS = 1 << 24
MAX_RATE_GBS = 1e6  # a paced load's bandwidth, GB/s: a thousand times any memory's today
TEN_YEARS_S = 10 * 365 * 86_400  # the longest expiry of a node-feature-discovery file

# A day's seconds times a thousand: longer than any run, short enough for every clock,
# sleep and buffer made from a duration
MAX_SECONDS = 86_400_000.0


def finite(value: object, what: str, above: float = 0.0, at_most: float = MAX_SECONDS) -> float:
    """A finite number greater than ``above`` and at most ``at_most`` (seconds, a
    factor): nan, inf, a bool or text are refused, never compared (nan passes every
    comparison's 'not below')."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidRequestError(f"{what} {value!r}: give a number above {above:g}")
    x = float(value)
    if not math.isfinite(x) or not x > above:
        raise InvalidRequestError(f"{what} {value!r}: give a finite number above {above:g}")
    if x > at_most:
        raise InvalidRequestError(f"{what} {value!r}: give at most {at_most:g}")
    return x


def instance(value: object, kind: type[T], what: str, hint: str) -> T:
    """An object a library call is handed (a request, a system, a tree): of ``kind``,
    else an InvalidRequestError saying what to give (``hint``), never an AttributeError
    from deep inside."""
    if not isinstance(value, kind):
        raise InvalidRequestError(f"{what} {value!r}: give {hint}")
    return value


def items(value: object, what: str, hint: str) -> list[object]:
    """A collection a library call is handed (blocks, layers): its items, listed once;
    a string or a thing that is not iterable is refused, saying what to give."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidRequestError(f"{what} {value!r}: give {hint}")
    return list(value)


def reals(value: object, what: str) -> tuple[float, ...]:
    """A non-empty sequence of numbers (rates, fractions), each a real number (their
    range is the caller's to check)."""
    items = value if isinstance(value, list | tuple) else None
    if not items or any(isinstance(v, bool) or not isinstance(v, numbers.Real) for v in items):
        raise InvalidRequestError(f"{what} {value!r}: give a list of numbers, such as [0.5, 0.9]")
    return tuple(float(v) for v in items)


def word(value: object, what: str, choices: Iterable[str]) -> str:
    """One of a fixed set of words (a kernel, a mode, a zone, a page size): ``value`` if
    it is one of ``choices``, else an InvalidRequestError listing them."""
    allowed = list(choices)
    if not isinstance(value, str) or value not in allowed:
        raise InvalidRequestError(f"{what} {value!r}: use {', '.join(allowed)}")
    return value


def list_items(spec: str, what: str, example: str, *, fold: bool = True) -> list[str]:
    """The grammar of every comma-separated list pycxl reads (names, ids, words, rates,
    weights): its items without the blanks around them. A list of none (an unset shell
    variable) and an empty item ('a,,b', as numactl refuses '0,,1') are refused, naming
    ``example``; an item given twice is one, unless ``fold`` is False (positions)."""
    items = [p.strip() for p in spec.split(",")]
    if not any(items):
        raise InvalidRequestError(f"{what} '{spec}' is empty, naming nothing: give {example}")
    if not all(items):
        raise InvalidRequestError(f"{what} '{spec}' has an empty item: give {example}")
    return list(dict.fromkeys(items)) if fold else items


def word_list(spec: object, what: str, choices: Iterable[str]) -> list[str]:
    """Comma-separated words, each one of ``choices`` ('read,3:1'), in the grammar of
    every list (``list_items``)."""
    allowed = list(choices)
    if not isinstance(spec, str):
        raise InvalidRequestError(f"{what} {spec!r}: use {', '.join(allowed)}")
    items = list_items(spec, what, f"one or more of {', '.join(allowed)}")
    for w in items:
        word(w, what, allowed)
    return items


def parse_spans(text: str) -> tuple[tuple[int, int], ...]:
    """A CPU or node list as the kernel writes it and numactl reads it ('0-3,8'), as
    (first, last) spans, not expanded: a range as long as '0-99999999999999' is
    checked against the ids that exist before anything is made of it. ValueError says
    what is wrong (a reversed range such as '1-0', a negative or non-numeric id, an
    empty list)."""
    spans: list[tuple[int, int]] = []
    if not text.strip():
        return ()  # as the kernel writes a CPU-less node's list; a person's is refused above
    for raw in text.strip().split(","):
        part = raw.strip()
        if not part:
            raise ValueError(f"'{text}' has an empty item: give ids or ranges such as 0-3,8")
        lo, sep, hi = part.partition("-")
        if not is_digits(lo) or (sep and not is_digits(hi)):
            raise ValueError(f"'{part}' is not an id or a range of ids such as 0-3")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"'{part}' is a reversed range: write {last}-{first}")
        spans.append((first, last))
    return tuple(spans)


def parse_ranges(text: str, limit: int | None = None) -> tuple[int, ...]:
    """The ids of a CPU or node list ('0-3,8' -> 0, 1, 2, 3, 8); ``limit``: every id is
    below it (checked before the list is expanded), else ValueError naming the ids
    beyond."""
    spans = parse_spans(text)
    if limit is not None:
        beyond = [(max(a, limit), b) for a, b in spans if b >= limit]
        if beyond:
            raise IdsBeyond(format_spans(beyond))
    return tuple(i for first, last in spans for i in range(first, last + 1))


class IdsBeyond(ValueError):
    """Ids of a list that are at or above the limit given (their spans, as text)."""


def format_spans(spans: Iterable[tuple[int, int]]) -> str:
    """'4-9,12' for ((4, 9), (12, 12))."""
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


def format_ranges(ids: Iterable[int]) -> str:
    """The other way: '0-3,8' for (0, 1, 2, 3, 8), as the kernel writes CPU lists."""
    out: list[list[int]] = []
    for i in ids:
        if out and out[-1][-1] == i - 1:
            out[-1][-1] = i
        else:
            out.append([i, i])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in out)


def pid(value: object) -> int:
    """A process id: a whole number from 1."""
    if isinstance(value, str) and is_digits(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise InvalidRequestError(f"process id {value!r}: give a number from 1, such as $$")
    return int(value)


def input_file(path: object, what: str) -> str:
    """A file pycxl reads (an expectation file, the event log): it exists, is not a
    directory, and this user may read it."""
    if not isinstance(path, str | os.PathLike):
        raise InvalidRequestError(f"{what} {path!r}: give a file name")
    text = os.fspath(path)
    if not text:
        raise InvalidRequestError(f"{what}: the path is empty; give a file name")
    if not os.path.exists(text):
        raise InvalidRequestError(f"{what} {text}: no such file")
    if os.path.isdir(text):
        raise InvalidRequestError(f"{what} {text} is a directory; give a file in it")
    if not os.path.isfile(text):  # a FIFO would block, /dev/zero never end
        raise InvalidRequestError(f"{what} {text} is not a regular file; give a file")
    if not os.access(text, os.R_OK):
        raise InvalidRequestError(f"{what} {text}: not readable by this user")
    return str(text)


def read_text(path: str, what: str) -> str:
    """The text of a file pycxl reads (an expectation file, the event log), checked as
    ``input_file`` does and decoded as UTF-8: bytes that are not are an error naming
    the file and where, never a traceback."""
    input_file(path, what)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InvalidRequestError(f"{what} {path}: {e.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InvalidRequestError(
            f"{what} {path}: line {line} is not UTF-8 text (byte {e.start}); write it as UTF-8"
        ) from None


SYSFS_TOP = ("devices", "bus")  # what every sysfs has at its top, one of them at least


def sysroot(path: object, source: str = "sysroot") -> str:
    """The folder a recorded sysfs tree lies in (or '/'): it must exist and hold sys/
    with sys/devices or sys/bus. Anything else is an error, never read as a system
    without CXL. ``source`` names where the path
    came from ('--sysroot', 'PYCXL_SYSROOT')."""
    if not isinstance(path, str | os.PathLike):
        raise InvalidRequestError(f"{source} {path!r}: give the folder of a sysfs tree")
    text = os.fspath(path)
    if not text:
        raise InvalidRequestError(f"{source}: the path is empty; give the folder of a sysfs tree")
    if not os.path.isdir(text):
        problem = "is not a directory" if os.path.exists(text) else "does not exist"
        raise InvalidRequestError(
            f"{source} {text} {problem}: it names the folder of a recorded sysfs tree "
            "(leave it unset for this machine)"
        )
    root = os.path.abspath(text)
    # a tree holds sys/devices or sys/bus, as /sys does: an empty folder, /proc or a
    # mistyped path is not read as a machine without CXL
    if root != "/" and not any(os.path.isdir(os.path.join(root, "sys", d)) for d in SYSFS_TOP):
        raise InvalidRequestError(
            f"{source} {text} is not a sysfs tree: it has no sys/devices or sys/bus; give "
            "the folder a tree was recorded into (the one holding sys/), or leave it unset "
            "for this machine"
        )
    return root
