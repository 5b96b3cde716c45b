"""Perf PMUs as the kernel describes them in sysfs (``/sys/bus/event_source/devices``):
each PMU's ``type``, the CPUs to count it on (``cpumask``), the bit fields of its event
terms (``format/``), and its named events (``events/``: terms such as
``event=0x04,umask=0x03``, with a ``.scale`` and a ``.unit`` where the kernel gives
counts in a unit). The same ABI ``perf list`` and ``perf stat`` read."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..base.errors import SysfsError
from ..base.sysfs import Sysfs

PMU_DIR = "/sys/bus/event_source/devices"
CONFIG_FIELDS = ("config", "config1", "config2")
_FORMAT = re.compile(r"^(config[12]?):([0-9,\-]+)$")
# units the kernel gives event scales in, as bytes
UNIT_BYTES = {"B": 1, "Bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


@dataclass(frozen=True)
class Event:
    """A named event of a PMU, ready for perf_event_open: its type and config words;
    ``bytes_per_count``: what one count is in bytes where its scale and unit say so."""

    pmu: str
    name: str
    type: int
    config: tuple[int, int, int]  # config, config1, config2
    cpus: tuple[int, ...]  # where to count it (the PMU's cpumask); () for any CPU
    scale: float
    unit: str | None

    @property
    def bytes_per_count(self) -> float | None:
        """Bytes per count, from the scale and a unit in bytes; None for other units."""
        factor = UNIT_BYTES.get(self.unit or "")
        return None if factor is None else self.scale * factor


def pmus(fs: Sysfs) -> list[str]:
    """The PMUs the kernel registered."""
    return fs.listdir(PMU_DIR)


def parse_format(text: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """'config:0-7' -> ('config', ((0, 7),)); 'config1:0-15,32' -> two spans."""
    m = _FORMAT.match(text.strip())
    if not m:
        raise ValueError(f"not a format such as config:0-7: {text!r}")
    spans = []
    for part in m.group(2).split(","):
        lo, _, hi = part.partition("-")
        spans.append((int(lo), int(hi or lo)))
    return m.group(1), tuple(spans)


def encode(terms: str, formats: dict[str, tuple[str, tuple[tuple[int, int], ...]]]
           ) -> tuple[int, int, int]:  # fmt: skip
    """An event's terms ('event=0x04,umask=0x03', 'config=0x1e98...') as config words,
    each term's value spread over its format's bits; ValueError for a term the PMU has
    no format for, or a value wider than its bits."""
    words = [0, 0, 0]
    for term in (t.strip() for t in terms.split(",") if t.strip()):
        name, _, value_text = term.partition("=")
        value = int(value_text, 0) if value_text else 1
        if name in CONFIG_FIELDS and name not in formats:
            fmt: tuple[str, tuple[tuple[int, int], ...]] = (name, ((0, 63),))
        elif name in formats:
            fmt = formats[name]
        else:
            raise ValueError(f"term {name!r} has no format")
        field, spans = fmt
        width = sum(hi - lo + 1 for lo, hi in spans)
        if value >> width:
            raise ValueError(f"term {term!r} is wider than its {width} bits")
        for lo, hi in spans:
            bits = hi - lo + 1
            words[CONFIG_FIELDS.index(field)] |= (value & ((1 << bits) - 1)) << lo
            value >>= bits
    return words[0], words[1], words[2]


def read_event(fs: Sysfs, pmu: str, name: str) -> Event | None:
    """PMU ``pmu``'s event ``name``; None where the PMU does not list it. A description
    pycxl cannot parse is a SysfsError naming the file."""
    base = f"{PMU_DIR}/{pmu}"
    terms = fs.read(f"{base}/events/{name}")
    if terms is None:
        return None
    pmu_type = fs.read_int(f"{base}/type")
    if pmu_type is None:
        return None
    formats = {}
    for f in fs.listdir(f"{base}/format"):
        text = fs.read(f"{base}/format/{f}") or ""
        try:
            formats[f] = parse_format(text)
        except ValueError as e:
            raise SysfsError(f"{base}/format/{f}", str(e)) from None
    try:
        config = encode(terms, formats)
    except ValueError as e:
        raise SysfsError(f"{base}/events/{name}", str(e)) from None
    scale_text = fs.read(f"{base}/events/{name}.scale")
    try:
        scale = float(scale_text) if scale_text else 1.0
    except ValueError:
        raise SysfsError(f"{base}/events/{name}.scale", f"not a number: {scale_text!r}") from None
    unit = fs.read(f"{base}/events/{name}.unit")
    cpus = fs.read_cpulist(f"{base}/cpumask") or ()
    return Event(pmu, name, pmu_type, config, cpus, scale, unit.strip() if unit else None)
