"""Traffic on each GPU's links and how busy its memory is, from NVML.

PCIe: the driver's cumulative byte counters (``NVML_FI_DEV_PCIE_COUNT_RX_BYTES`` and
``_TX_BYTES``, fields 198 and 197, drivers r550 and later), which the differences of two
reads turn into rates over any interval. They count the packets' bytes (an H200 read
1.08x a host-to-device copy's payload, 1.09x device-to-host), where the sampled
throughput below also counts the link's own traffic (1.11-1.12x). Where they are 32-bit
(an H200's are: 2^32 bytes pass in 0.07 s on a Gen5 x16 link), a thread reads them every
10 ms to unwrap them, and an interval in which it fell behind (two reads further apart
than the GPU's link at its best could wrap the counter) has no figure. Where the driver lacks
them, ``nvmlDeviceGetPcieThroughput``: the driver's own count over 20 ms, in KB/s, one
sample per read. Each GPU's method is named in its reading. NVLink: the links' data counters
(fields 138 and 139, KiB, summed over all links), where the GPU has links; C2C (Grace
Hopper's chip-to-chip link): NVML says how many links and how fast, and counts no bytes.
Memory: the share of the last sample period in which the GPU's memory was read or
written (``nvmlDeviceGetUtilizationRates``, nvidia-smi dmon's ``mem``).

Every field has its own return code: a field the GPU does not support
(``NVML_ERROR_NOT_SUPPORTED``) is a missing figure with NVML's words, never a zero."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..base._lib.loader import has_symbol
from ..counters.base import (
    C2C_RX,
    C2C_TX,
    HBM_BUSY,
    NVLINK_RX,
    NVLINK_TX,
    PCIE_RX,
    PCIE_TX,
    Key,
    Missing,
    Reading,
    Subject,
)
from .inventory import GpuDevice
from .nvml_session import NVML_SUCCESS, NvmlUnusable, error_text, session

SOURCE = "nvml"
# NVML_FI_* field ids (nvml.h)
FI_NVLINK_SPEED_MBPS_COMMON = 90
FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_THROUGHPUT_DATA_TX = 138  # KiB, all links with SCOPE_ALL_LINKS
FI_NVLINK_THROUGHPUT_DATA_RX = 139
FI_C2C_LINK_COUNT = 170
FI_C2C_LINK_GET_MAX_BW = 172  # MB/s per link
FI_PCIE_COUNT_TX_BYTES = 197  # "Value can be wrapped"
FI_PCIE_COUNT_RX_BYTES = 198
SCOPE_ALL_LINKS = 0xFFFFFFFF
PCIE_UTIL_TX_BYTES, PCIE_UTIL_RX_BYTES = 0, 1  # nvmlPcieUtilCounter_t
KB = 1024  # nvmlDeviceGetPcieThroughput's KB/s
KIB = 1024
# nvmlValueType_t -> (the union member, its width in bits; None: not a count)
VALUE_TYPES: dict[int, tuple[str, int | None]] = {
    0: ("dVal", None), 1: ("uiVal", 32), 2: ("ulVal", 64), 3: ("ullVal", 64),
    4: ("sllVal", 64), 5: ("siVal", 32), 6: ("usVal", 16),
}  # fmt: skip
# a counter this narrow wraps faster than an interval at PCIe speeds (2^32 B in 0.07 s
# at 63 GB/s): it is read often, on a thread, to unwrap it
MIN_COUNTER_BITS = 48
POLL_S = 0.010
# two reads further apart than a narrow counter takes to wrap at the link's best rate may
# have missed a wrap; where the link is unknown, the fastest a GPU has (Gen6 x16)
FASTEST_LINK = 121e9
NVLINK_MAX, C2C_MAX = "nvlink_max", "c2c_max"  # bytes/s per direction, from NVML
# what every reading needs (nvmlDeviceGetFieldValues is optional: sampled without it)
NEEDED = ("nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetPcieThroughput",
          "nvmlDeviceGetUtilizationRates")  # fmt: skip


@dataclass
class _Gpu:
    """One GPU's handle and how each of its figures is read."""

    index: int
    handle: Any
    pcie: str  # 'counters', 'polled' (narrow counters, read often) or 'sampled'
    pcie_why: str = ""  # why sampled
    pcie_bits: int = 64
    link_bytes_per_s: float = FASTEST_LINK  # the most the counters can move a second
    nvlink: bool = False
    missing: dict[str, Missing] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)  # constant: the links' maxima
    unwrapped: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # id: raw, bits, total
    last_stamp_us: int = 0  # NVML's time of the last PCIe counter read
    lapses: int = 0  # reads that came too late to be sure of every wrap
    lapses_seen: int = 0  # ... as of the last reading
    lapse_gap_us: int = 0  # how far apart the reads of the last lapse were
    resuming: bool = False  # the last reading lapsed: the next interval has no start


class GpuLinks:
    """NVML's counters of every GPU given."""

    source = SOURCE

    def __init__(self, ffi: Any, lib: Any, gpus: list[_Gpu], missing: dict[Key, Missing]) -> None:
        self.ffi, self.lib, self.gpus, self.missing = ffi, lib, gpus, missing
        self._lock = threading.Lock()  # the poller and read() unwrap the same counters
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        if any(g.pcie == "polled" for g in gpus):
            self._poller = threading.Thread(target=self._poll, name="pycxl-nvml-poll", daemon=True)
            self._poller.start()

    def _poll(self) -> None:
        """Every POLL_S, each narrow counter read once, so that no wrap goes unseen."""
        polled = [g for g in self.gpus if g.pcie == "polled"]
        while not self._stop.wait(POLL_S):
            with self._lock:
                for g in polled:
                    self._read_pcie(g)

    def read(self) -> Reading:
        """Each GPU's link counters (or sampled rates) and memory busy now."""
        totals: dict[Key, float] = {}
        stamps: dict[Key, float] = {}
        rates: dict[Key, float] = {}
        missing = dict(self.missing)
        methods: dict[Subject, str] = {}
        for g in self.gpus:
            subject: Subject = ("gpu", g.index)
            missing.update({(subject, f): m for f, m in g.missing.items()})
            rates.update({(subject, f): v for f, v in g.rates.items()})
            self._read_fields(g, subject, totals, stamps, missing)
            if g.pcie == "sampled":
                self._sample_pcie(g, subject, rates, missing)
            self._read_busy(g, subject, rates, missing)
            methods[subject] = _method(g)
        return Reading(SOURCE, time.monotonic(), totals=totals, stamps=stamps, rates=rates,
                       missing=missing, methods=methods)  # fmt: skip

    def _read_fields(self, g: _Gpu, subject: Subject, totals: dict[Key, float],
                     stamps: dict[Key, float], missing: dict[Key, Missing]) -> None:  # fmt: skip
        wanted: list[tuple[int, int, str, int]] = []  # field, scope, figure, bytes per unit
        if g.pcie == "counters":
            wanted += [(FI_PCIE_COUNT_RX_BYTES, 0, PCIE_RX, 1),
                       (FI_PCIE_COUNT_TX_BYTES, 0, PCIE_TX, 1)]  # fmt: skip
        elif g.pcie == "polled":
            with self._lock:
                self._read_pcie(g)
                lapsed, resuming = g.lapses != g.lapses_seen, g.resuming
                g.lapses_seen = g.lapses
                for fid, figure in ((FI_PCIE_COUNT_RX_BYTES, PCIE_RX),
                                    (FI_PCIE_COUNT_TX_BYTES, PCIE_TX)):  # fmt: skip
                    key = (subject, figure)
                    if fid not in g.unwrapped:
                        missing[key] = Missing("nvml-error", "NVML: the PCIe counters could "
                                               "not be read")  # fmt: skip
                    elif lapsed:
                        missing[key] = _lapse(g)
                    else:
                        totals[key] = g.unwrapped[fid][2]
                        stamps[key] = g.last_stamp_us / 1e6
                        if resuming:  # the interval's start had no total: say why
                            missing[key] = _lapse(g)
                g.resuming = lapsed
        if g.nvlink:
            wanted += [(FI_NVLINK_THROUGHPUT_DATA_RX, SCOPE_ALL_LINKS, NVLINK_RX, KIB),
                       (FI_NVLINK_THROUGHPUT_DATA_TX, SCOPE_ALL_LINKS, NVLINK_TX, KIB)]  # fmt: skip
        if not wanted:
            return
        values = _fields(self.ffi, self.lib, g.handle, [(f, s) for f, s, _, _ in wanted])
        for (fid, _, figure, unit), got in zip(wanted, values, strict=True):
            key = (subject, figure)
            if isinstance(got, Missing):
                missing[key] = got
                continue
            raw, bits, stamp_us = got
            totals[key] = _unwrap(g, fid, raw, bits) * unit
            if stamp_us > 0:
                stamps[key] = stamp_us / 1e6

    def _read_pcie(self, g: _Gpu) -> None:
        """A narrow counter pair read and unwrapped (the lock held); a read later than a
        wrap could take counts as a lapse."""
        rx, tx = _fields(self.ffi, self.lib, g.handle,
                         [(FI_PCIE_COUNT_RX_BYTES, 0), (FI_PCIE_COUNT_TX_BYTES, 0)])  # fmt: skip
        if isinstance(rx, Missing) or isinstance(tx, Missing):
            return  # the last totals stand; the next read tries again
        stamp = max(rx[2], tx[2])
        if g.last_stamp_us:
            gap = stamp - g.last_stamp_us
            if gap > (1 << g.pcie_bits) / g.link_bytes_per_s * 1e6:
                g.lapses, g.lapse_gap_us = g.lapses + 1, gap
        g.last_stamp_us = stamp
        _unwrap(g, FI_PCIE_COUNT_RX_BYTES, rx[0], rx[1])
        _unwrap(g, FI_PCIE_COUNT_TX_BYTES, tx[0], tx[1])

    def _sample_pcie(self, g: _Gpu, subject: Subject, rates: dict[Key, float],
                     missing: dict[Key, Missing]) -> None:  # fmt: skip
        value = self.ffi.new("unsigned int *")
        for counter, figure in ((PCIE_UTIL_RX_BYTES, PCIE_RX), (PCIE_UTIL_TX_BYTES, PCIE_TX)):
            rc = self.lib.nvmlDeviceGetPcieThroughput(g.handle, counter, value)
            if rc == NVML_SUCCESS:
                rates[(subject, figure)] = int(value[0]) * KB
            else:
                missing[(subject, figure)] = _nvml_missing(self.ffi, self.lib, rc,
                                                           "PCIe throughput")  # fmt: skip

    def _read_busy(self, g: _Gpu, subject: Subject, rates: dict[Key, float],
                   missing: dict[Key, Missing]) -> None:  # fmt: skip
        util = self.ffi.new("nvmlUtilization_t *")
        rc = self.lib.nvmlDeviceGetUtilizationRates(g.handle, util)
        if rc == NVML_SUCCESS:
            rates[(subject, HBM_BUSY)] = int(util.memory) / 100
        else:
            missing[(subject, HBM_BUSY)] = _nvml_missing(self.ffi, self.lib, rc,
                                                         "memory utilization")  # fmt: skip

    def close(self) -> None:
        """The poller stopped; NVML stays started for the process (nvml_session)."""
        self._stop.set()
        if self._poller is not None:
            self._poller.join()
            self._poller = None


def open_reader(devices: Sequence[GpuDevice], links: Mapping[int, float] | None = None
                ) -> GpuLinks:  # fmt: skip
    """NVML's link counters of ``devices``; ``links``: each GPU's (by index) PCIe
    bandwidth at the link's best speed, bytes/s, where known. Where NVML cannot start,
    every figure of every GPU is missing with NVML's reason."""
    try:
        with session() as (ffi, lib):
            pass  # started once, left running for the process: its handles stay good
    except NvmlUnusable as e:
        why = Missing("no-NVML", f"{e} (NVML comes with the NVIDIA driver)")
        return GpuLinks(None, None, [], {(("gpu", d.index), f): why for d in devices
                                         for f in (PCIE_RX, PCIE_TX, HBM_BUSY)})  # fmt: skip
    lacking = [f for f in NEEDED if not has_symbol(lib, f)]
    if lacking:
        why = Missing(
            "no-NVML",
            f"this NVML lacks {', '.join(lacking)} (an old driver, or pycxl's NVML "
            "declarations built before pycxl top: reinstall pycxl)",
        )
        return GpuLinks(ffi, lib, [], {(("gpu", d.index), f): why for d in devices
                                       for f in (PCIE_RX, PCIE_TX, HBM_BUSY)})  # fmt: skip
    missing: dict[Key, Missing] = {}
    gpus = []
    for d in devices:
        handle = ffi.new("nvmlDevice_t *")
        rc = lib.nvmlDeviceGetHandleByPciBusId_v2(d.pci_bus_id.encode(), handle)
        if rc != NVML_SUCCESS:
            why = _nvml_missing(ffi, lib, rc, f"the GPU at {d.pci_bus_id}")
            missing.update({(("gpu", d.index), f): why for f in (PCIE_RX, PCIE_TX, HBM_BUSY)})
            continue
        g = _probe(ffi, lib, d.index, handle[0])
        g.link_bytes_per_s = (links or {}).get(d.index) or FASTEST_LINK
        gpus.append(g)
    return GpuLinks(ffi, lib, gpus, missing)


def _probe(ffi: Any, lib: Any, index: int, handle: Any) -> _Gpu:
    """Which of a GPU's counters NVML has, and the links' maxima."""
    if not has_symbol(lib, "nvmlDeviceGetFieldValues"):
        return _Gpu(index, handle, "sampled", "this NVML has no field values")
    ask = [
        (FI_PCIE_COUNT_RX_BYTES, 0),
        (FI_PCIE_COUNT_TX_BYTES, 0),
        (FI_NVLINK_LINK_COUNT, 0),
        (FI_NVLINK_SPEED_MBPS_COMMON, 0),
        (FI_C2C_LINK_COUNT, 0),
        (FI_C2C_LINK_GET_MAX_BW, 0),
    ]
    rx, tx, nvlinks, nvspeed, c2c, c2c_bw = _fields(ffi, lib, handle, ask)
    g = _Gpu(index, handle, "counters")
    for got in (rx, tx):
        if isinstance(got, Missing):
            g.pcie, g.pcie_why = "sampled", f"no cumulative counter: {got.reason}"
        elif got[1] < MIN_COUNTER_BITS and g.pcie != "sampled":
            g.pcie, g.pcie_bits = "polled", got[1]
    links = 0 if isinstance(nvlinks, Missing) else nvlinks[0]
    if links > 0:
        g.nvlink = True
        if not isinstance(nvspeed, Missing) and nvspeed[0] > 0:
            g.rates[NVLINK_MAX] = links * nvspeed[0] * 1e6
    c2c_links = 0 if isinstance(c2c, Missing) else c2c[0]
    if c2c_links > 0:
        speed = "" if isinstance(c2c_bw, Missing) else f", {c2c_bw[0]} MB/s each"
        why = Missing("no-counter", f"NVML reports {c2c_links} C2C links{speed}, and counts "
                      "no bytes on them")  # fmt: skip
        g.missing[C2C_RX] = g.missing[C2C_TX] = why
        if not isinstance(c2c_bw, Missing) and c2c_bw[0] > 0:
            g.rates[C2C_MAX] = c2c_links * c2c_bw[0] * 1e6
    return g


def _fields(ffi: Any, lib: Any, handle: Any, ask: list[tuple[int, int]]
            ) -> list[tuple[int, int, int] | Missing]:  # fmt: skip
    """(value, width in bits, NVML's timestamp in us) of each (field, scope), or why not."""
    values = ffi.new(f"nvmlFieldValue_t[{len(ask)}]")
    for i, (fid, scope) in enumerate(ask):
        values[i].fieldId, values[i].scopeId = fid, scope
    rc = lib.nvmlDeviceGetFieldValues(handle, len(ask), values)
    if rc != NVML_SUCCESS:
        return [_nvml_missing(ffi, lib, rc, "field values")] * len(ask)
    out: list[tuple[int, int, int] | Missing] = []
    for i, (fid, _) in enumerate(ask):
        v = values[i]
        kind = VALUE_TYPES.get(int(v.valueType))
        if v.nvmlReturn != NVML_SUCCESS:
            out.append(_nvml_missing(ffi, lib, int(v.nvmlReturn), f"field {fid}"))
        elif kind is None or kind[1] is None:
            out.append(Missing("not-a-count", f"NVML gives field {fid} as type {v.valueType}"))
        else:
            raw = int(getattr(v.value, kind[0]))
            out.append((raw % (1 << kind[1]), kind[1], int(v.timestamp)))
    return out


def _unwrap(g: _Gpu, fid: int, raw: int, bits: int) -> int:
    """A counter that 'can be wrapped' as one that only grows: each read adds what the
    counter moved since the last, modulo its width."""
    last = g.unwrapped.get(fid)
    total = raw if last is None else last[2] + (raw - last[0]) % (1 << bits)
    g.unwrapped[fid] = (raw, bits, total)
    return total


def _method(g: _Gpu) -> str:
    if g.pcie == "counters":
        pcie = "NVML cumulative PCIe byte counters"
    elif g.pcie == "polled":
        pcie = (
            f"NVML cumulative PCIe byte counters ({g.pcie_bits}-bit, read every "
            f"{POLL_S * 1e3:.0f} ms to unwrap)"
        )
    else:
        pcie = (
            f"NVML PCIe throughput sampled over 20 ms, packet headers counted with the "
            f"payload ({g.pcie_why})"
        )
    return pcie + ("; NVLink data counters" if g.nvlink else "")


def _lapse(g: _Gpu) -> Missing:
    wrap_ms = (1 << g.pcie_bits) / g.link_bytes_per_s * 1e3
    return Missing(
        "lapsed",
        f"the {g.pcie_bits}-bit PCIe counters were read {g.lapse_gap_us / 1e3:.0f} ms "
        f"apart, and can wrap in {wrap_ms:.0f} ms: no figure for this interval (a busy host "
        "kept the reading thread waiting)",
    )


def _nvml_missing(ffi: Any, lib: Any, rc: int, what: str) -> Missing:
    text = error_text(ffi, lib, rc)
    short = {3: "not-supported", 4: "no-permission"}.get(rc, "nvml-error")
    return Missing(short, f"NVML: {what}: {text}")
