"""The compiled native code (native/bench.c, loaded.c, copy.c as ``pycxl._bench``),
loaded on first use and wrapped: the only module that touches its ffi and lib. Callers
pass addresses of memory they own (a NumaBuffer's, an array's), counts and CPU ids, and
get Python values back; pools and load threads are objects that free themselves.

No call into the measurement loops runs much past CALL_NS: a long measurement is a
series of calls, each going on where the last stopped (the loops take a time budget and
say how far they got; a chase is cut by loads). Between calls Python runs its signal
handlers, so Ctrl-C raises KeyboardInterrupt within a fraction of a second, with no C
loop running; the ``finally`` here stops the STREAM threads, and the callers' ``with``
blocks free the memory. The timed regions are those of one call: a sample is never
split, except a chase's, whose parts are timed back to back and added."""

from __future__ import annotations

import importlib
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

from ..errors import InvalidRequestError, NotAvailableError, OperationError

# How long one call into the loops may run (plus the sample that crosses it): what a
# signal waits for, and long enough that the calls cost nothing a result shows (between
# calls the STREAM threads sleep; they wake outside every timed kernel).
CALL_NS = 200_000_000
# A chase's first call: short enough at any latency (65 ms at 1 us a load) to learn the
# rate the next calls are cut by.
FIRST_LOADS = 1 << 16


@cache
def _compiled() -> tuple[Any, Any]:
    """(ffi, lib) of pycxl._bench."""
    try:
        bench = importlib.import_module("pycxl._bench")
    except ImportError as e:
        raise NotAvailableError(
            "the native measurement code is not built (pycxl._bench is missing): reinstall "
            f"pycxl where a C compiler is present (pip install .) ({e})"
        ) from None
    return bench.ffi, bench.lib


def _chars(address: int) -> Any:
    ffi, _ = _compiled()
    return ffi.cast("char *", address)


# --- pointer chase (bench.c, loaded.c) ---------------------------------------------------
def chase_build(address: int, size: int, stride: int, group: int) -> None:
    """Link the lines of [address, address+size), one every ``stride`` bytes, into one
    random cycle (random order inside groups of ``group`` bytes, groups in random order);
    each line holds the address of the next."""
    ffi, lib = _compiled()
    err = ffi.new("int *")
    builder = lib.chase_build_start(_chars(address), size // stride, stride, group, 0, err)
    if builder == ffi.NULL:
        if err[0] == -2:
            raise OperationError(f"out of memory for the order of a {size}-byte chase")
        raise InvalidRequestError(f"cannot build a chase over {size} bytes in groups of {group}")
    try:
        while not lib.chase_build_step(builder, CALL_NS):
            pass
    finally:
        lib.chase_build_end(builder)


def chase_run(address: int, loads: int) -> int:
    """Nanoseconds ``loads`` dependent loads take (a multiple of 16), following the cycle
    from ``address``. Calls of about CALL_NS each (sized by the rate so far), each from
    where the last stopped: the same loads, timed back to back."""
    ffi, lib = _compiled()
    cursor = ffi.new("void **", ffi.cast("void *", address))
    loads -= loads % 16
    part = min(loads, FIRST_LOADS)
    done = ns = 0
    while True:
        ns += int(lib.chase_run(cursor, part))
        done += part
        if done >= loads:
            return ns
        # what the budget holds at the rate so far; at most 8x the last call, in case
        # the first loads hit a cache
        fits = CALL_NS * done // max(ns, 1)
        part = min(loads - done, max(16, min(8 * part, fits) // 16 * 16))


class ChaseCursor:
    """A place in a cycle that timed windows of loads go on from."""

    def __init__(self, address: int) -> None:
        ffi, self._lib = _compiled()
        self._ffi = ffi
        self._cursor = ffi.new("void **", ffi.cast("void *", address))

    def windows(self, loads: int, seconds: float) -> list[int]:
        """Nanoseconds of each window of ``loads`` loads, window after window, for
        ``seconds`` (never below 10 ns a load), in calls of at most CALL_NS."""
        cap = int(seconds * 1e9 / (loads * 10)) + 16
        per_call = min(cap, int(CALL_NS / (loads * 10)) + 16)  # one call's, reused
        out = self._ffi.new("uint32_t[]", per_call)
        end = time.monotonic_ns() + int(seconds * 1e9)  # CLOCK_MONOTONIC, as loaded.c
        got: list[int] = []
        while len(got) < cap:
            left = end - time.monotonic_ns()
            if got and left <= 0:
                break
            n = self._lib.chase_windows(self._cursor, loads, min(max(left, 0), CALL_NS),
                                        out, min(per_call, cap - len(got)))  # fmt: skip
            got += [int(out[i]) for i in range(n)]
        return got


# --- STREAM and first touch (bench.c) -----------------------------------------------------
def stream_has_nt() -> bool:
    """Whether STREAM can store non-temporally here (AVX)."""
    return bool(_compiled()[1].stream_has_nt())


def stream_run(
    kernels: Sequence[int], arrays: tuple[int, int, int], n: int, scalar: float,
    cpus: Sequence[int], passes: int, nt: bool,
) -> list[int]:  # fmt: skip
    """Run the STREAM kernels (ids in bench.c's order) ``passes`` times over three arrays
    of ``n`` doubles at ``arrays``, one thread per CPU of ``cpus``, the same threads
    throughout; nanoseconds of each kernel of each pass, pass by pass. (Calls of about
    CALL_NS, each from the kernel where the last stopped; the threads sleep between.)"""
    ffi, lib = _compiled()
    steps = passes * len(kernels)
    times = ffi.new("uint64_t[]", steps)
    doubles = [ffi.cast("double *", a) for a in arrays]
    ids, on = ffi.new("int[]", list(kernels)), ffi.new("int[]", list(cpus))
    err = ffi.new("int *")
    team = lib.stream_start(len(cpus), on, err)
    if team == ffi.NULL:
        raise OperationError(f"stream worker threads could not start (error {err[0]})")
    try:
        first = 0
        while first < steps:
            first += lib.stream_steps(team, ids, len(kernels), *doubles, n, scalar, int(nt),
                                      first, steps - first, CALL_NS, times)  # fmt: skip
    finally:
        lib.stream_end(team)
    return [int(t) for t in times]


def first_touch(address: int, npages: int, page: int, ns: Any) -> int:
    """Write the first byte of each of ``npages`` pages at ``address``, each page's time
    into ``ns`` (a uint32 numpy array); the nanoseconds of all (calls of about CALL_NS,
    each from the page where the last stopped)."""
    ffi, lib = _compiled()
    out = ffi.cast("uint32_t *", ns.ctypes.data)
    part = ffi.new("uint64_t *")
    done = total = 0
    while done < npages:
        done += lib.first_touch(_chars(address + done * page), npages - done, page, out + done,
                                CALL_NS, part)  # fmt: skip
        total += int(part[0])
    return total


def timer_cost_ns() -> int:
    """What reading the clock costs, in nanoseconds."""
    return int(_compiled()[1].timer_cost_ns())


# --- load generators (loaded.c) -----------------------------------------------------------
def load_has_nt() -> bool:
    """Whether load threads can store non-temporally here (AVX)."""
    return bool(_compiled()[1].load_has_nt())


def load_mix_streams(mix: int) -> int:
    """Streams a load thread of mix ``mix`` (loaded.c's order) moves at once."""
    return int(_compiled()[1].load_mix_streams(mix))


class LoadThreads:
    """Threads on ``cpus``, each moving its ``slice`` of the buffer at ``address`` with
    mix ``mix``, paced to ``bytes_per_s`` in all (None: as fast as they go)."""

    def __init__(self, address: int, slice_: int, cpus: Sequence[int], mix: int,
                 bytes_per_s: float | None) -> None:  # fmt: skip
        ffi, self._lib = _compiled()
        err = ffi.new("int *")
        run = self._lib.load_start(_chars(address), slice_, len(cpus), ffi.new("int[]", list(cpus)),
                                   mix, bytes_per_s or 0.0, err)  # fmt: skip
        if run == ffi.NULL:
            raise OperationError(f"load threads could not start (error {err[0]})")
        self._run: Any = run

    def moved(self) -> int:
        """Bytes the threads have moved so far, all of them together."""
        return int(self._lib.load_moved(self._run))

    def stop(self) -> None:
        """Stop the threads and wait for them (idempotent)."""
        if self._run is not None:
            self._lib.load_stop(self._run)
            self._run = None


# --- the copy threads of the staged copier (copy.c) ----------------------------------------
class CopyTeam:
    """Copy threads pinned to ``cpus``; stopped on ``close()`` or when collected."""

    def __init__(self, cpus: Sequence[int]) -> None:
        ffi, lib = _compiled()
        pool = lib.copy_pool_create(len(cpus), ffi.new("int[]", list(cpus)))
        if pool == ffi.NULL:
            raise OperationError(f"cannot start {len(cpus)} copy threads")
        self._ffi, self._lib, self._pool = ffi, lib, pool
        self._stop = weakref.finalize(self, lib.copy_pool_destroy, pool)
        self.threads = len(cpus)

    @contextmanager
    def transfer(self, address: int, stage: Sequence[int], size: int, chunk: int, *,
               to_host: bool, nt: bool, opened: int) -> Iterator[Transfer]:  # fmt: skip
        """One transfer of ``size`` bytes at ``address`` through the staging buffers at
        ``stage``, chunk by chunk; leaving the block waits for the threads, or on an
        error stops them before they start anything more."""
        ffi = self._ffi
        bufs = ffi.new("char *[]", [ffi.cast("char *", b) for b in stage])
        rc = self._lib.copy_stream_start(self._pool, _chars(address), bufs, len(stage), size,
                                         chunk, int(to_host), int(nt), opened)  # fmt: skip
        if rc:
            raise OperationError("cannot start the copy threads' transfer: out of memory")
        failed = True
        try:
            yield Transfer(self._lib, self._pool)
            failed = False
        finally:
            self._lib.copy_stream_end(self._pool, int(failed))

    def close(self) -> None:
        """Stop the threads (idempotent)."""
        self._stop()


class Transfer:
    """A transfer under way: ``open(n)`` lets the threads copy chunks below ``n``,
    ``wait(i)`` returns when chunk ``i`` is copied."""

    def __init__(self, lib: Any, pool: Any) -> None:
        self._lib, self._pool = lib, pool

    def open(self, chunks: int) -> None:
        """Let the threads copy every chunk below ``chunks``."""
        self._lib.copy_stream_open(self._pool, chunks)

    def wait(self, chunk: int) -> None:
        """Return when chunk ``chunk`` is copied."""
        self._lib.copy_stream_wait(self._pool, chunk)


# --- GPU-addressable memory on a tier (tier.c) ------------------------------------------------
TIER_SLOTS = 8
# tier.c's ways to make a slot's memory: on the host node where the driver can, else
# registered; on the host node only; registered only
TIER_MODES = {"auto": 0, "host-numa": 1, "registered": 2}
TIER_STAT_FIELDS = ("bytes_now", "bytes_peak", "allocations", "bytes_allocated", "refused",
                    "misplaced_pages", "mapped", "gpu_refusals")  # fmt: skip


def module_path() -> str:
    """The compiled module's file: PyTorch loads the tier allocators from it by name."""
    bench = importlib.import_module("pycxl._bench")
    return str(bench.__file__)


def tier_open(slot: int, node: int, devices: Sequence[int], mode: int = 0) -> tuple[int, str]:
    """Open tier slot ``slot`` as a pool on host ``node`` for the CUDA ``devices``, its
    memory made as ``mode`` says (TIER_MODES): 0, or the CUDA result (-1: no driver entry
    point), with the message."""
    ffi, lib = _compiled()
    err = ffi.new("char[512]")
    rc = int(lib.tier_open(slot, node, ffi.new("int[]", list(devices)), len(devices), mode,
                           err, 512))  # fmt: skip
    return rc, ffi.string(err).decode(errors="replace")


def tier_registered(slot: int) -> bool:
    """Whether open slot ``slot`` makes registered memory (mbind + cuMemHostRegister)
    rather than memory the driver creates on the host node."""
    return int(_compiled()[1].tier_registered(slot)) == 1


def tier_stats(slot: int) -> tuple[dict[str, int], str]:
    """The slot's counters (TIER_STAT_FIELDS) and its last error."""
    ffi, lib = _compiled()
    out, err = ffi.new("uint64_t[8]"), ffi.new("char[256]")
    if lib.tier_stats(slot, out, err, 256) != 0:
        raise InvalidRequestError(f"tier slot {slot} is not open")
    return dict(zip(TIER_STAT_FIELDS, (int(v) for v in out), strict=True)), ffi.string(err).decode(
        errors="replace"
    )


def tier_alloc(slot: int, size: int, stream: int = 0) -> int:
    """Device pointer of ``size`` bytes from the slot's pool, in ``stream``'s order; 0 when
    refused (tier_stats says why)."""
    ffi, lib = _compiled()
    return int(lib.tier_alloc(slot, size, ffi.cast("void *", stream)))


def tier_free(pointer: int, stream: int = 0) -> None:
    """Free a tier allocation after ``stream``'s work on it (kept for reuse)."""
    ffi, lib = _compiled()
    lib.tier_free(pointer, ffi.cast("void *", stream))


def tier_trim(slot: int) -> None:
    """Give the slot's cached mappings back to the driver."""
    _compiled()[1].tier_trim(slot)


def tier_spill_to(slot: int, headroom: int) -> None:
    """The slot the whole-process allocator spills to (-1: none), and the GPU memory it
    leaves free for what does not come through it (cuBLAS, cuDNN)."""
    if _compiled()[1].tier_spill_to(slot, headroom) != 0:
        raise InvalidRequestError(f"tier slot {slot} is not open")


def tier_prefer(slot: int) -> int:
    """This thread's allocations through the whole-process allocator go to ``slot`` (-1:
    the GPU's memory first); returns the slot before."""
    return int(_compiled()[1].tier_prefer(slot))


# tier.c's figures of a spilling process, by device, in its order; each is current, peak,
# allocated and freed
USE_FIGURES = ("bytes", "bytes_small", "bytes_large", "count", "count_small", "count_large",
               "hbm_bytes", "tier_bytes", "tier_state_bytes", "tier_saved_bytes",
               "tier_other_bytes")  # fmt: skip
USE_KINDS = {"other": 0, "optimizer_state": 1, "saved_activations": 2}


def tier_use(device: int) -> tuple[dict[str, tuple[int, int, int, int]], int]:
    """What the spilling process holds on CUDA ``device``: each of USE_FIGURES as (current,
    peak, allocated, freed), and the lifetime peak of its bytes."""
    ffi, lib = _compiled()
    n = len(USE_FIGURES)
    out = ffi.new(f"int64_t[{4 * n + 1}]")
    if lib.tier_use(device, out) != 0:
        raise InvalidRequestError(f"CUDA device {device} is out of the spill's range")
    values = [int(v) for v in out]
    figures = {name: (values[4 * i], values[4 * i + 1], values[4 * i + 2], values[4 * i + 3])
               for i, name in enumerate(USE_FIGURES)}  # fmt: skip
    return figures, values[4 * n]


def tier_use_reset(device: int, totals: bool) -> None:
    """Reset the spilling process's peaks on ``device`` (or, ``totals``, its totals)."""
    _compiled()[1].tier_use_reset(device, 1 if totals else 0)


def tier_spilled_rise(device: int) -> int:
    """How far the bytes spilled on ``device`` (on the tier for no placement's sake) rose
    above where they stood at the last call: what HBM lacked since. Counts from now."""
    rise = int(_compiled()[1].tier_spilled_rise(device))
    if rise < 0:
        raise InvalidRequestError(f"CUDA device {device} is out of the spill's range")
    return rise


def tier_kind(kind: int) -> int:
    """What this thread's tier allocations are made for from now on (USE_KINDS); returns
    the kind before."""
    return int(_compiled()[1].tier_kind(kind))


def _now_and_high(call: str, *args: int) -> tuple[int, int] | None:
    """tier.c's ``call(*args, &now, &high)``: the pair, or None where it returns non-zero."""
    ffi, lib = _compiled()
    now, high = ffi.new("uint64_t *"), ffi.new("uint64_t *")
    if getattr(lib, call)(*args, now, high) != 0:
        return None
    return int(now[0]), int(high[0])


def tier_hbm_reserved(device: int) -> tuple[int, int] | None:
    """Bytes the device's stream-ordered pool reserves now and at its high mark (None:
    the driver cannot tell)."""
    return _now_and_high("tier_hbm_reserved", device)


def tier_spill_mapped() -> tuple[int, int] | None:
    """Bytes the spill tier maps now (in use or kept for reuse) and at its high mark
    (None: this process does not spill)."""
    return _now_and_high("tier_spill_mapped")


def tier_owns(pointer: int) -> bool:
    """Whether ``pointer`` starts a live tier allocation."""
    return int(_compiled()[1].tier_owns(pointer)) == 1


def tier_hbm_room(device: int, settle: bool = False) -> int | None:
    """Bytes a spilling process can still take of ``device``'s memory: the driver's free
    memory and what its pool holds unused (None: the driver cannot tell). ``settle``
    (with the device synchronised): the pool's idle memory is given back first, so the
    answer is what one large allocation can get."""
    room = int(_compiled()[1].tier_hbm_room(device, 1 if settle else 0))
    return None if room >= (1 << 64) - 1 else room


_spill_listener: list[Any] = []


def tier_log(listener: Any) -> None:
    """Call ``listener(slot, size)`` on each spill made on this thread (None: stop)."""
    ffi, lib = _compiled()
    if not _spill_listener:

        @ffi.def_extern()  # type: ignore[untyped-decorator]
        def tier_spilled(slot: int, size: int) -> None:
            if _spill_listener and _spill_listener[0] is not None:
                _spill_listener[0](int(slot), int(size))

        _spill_listener.append(None)
    _spill_listener[0] = listener
    lib.tier_log(1 if listener is not None else 0)


# --- the CPU Adam step over state on a tier (adam.c) ------------------------------------
# adam.c's precisions: of the gradient, and of the weight copy written beside the master
ADAM_KINDS = {"float32": 0, "bfloat16": 1, "float16": 2}
ADAM_NO_WEIGHT = -1


class AdamTeam:
    """Threads pinned to ``cpus`` that run Adam and AdamW steps (and gradient sums);
    stopped on ``close()`` or when collected. One call at a time: a caller on another
    thread needs a team of its own."""

    def __init__(self, cpus: Sequence[int]) -> None:
        ffi, lib = _compiled()
        err = ffi.new("int *")
        team = lib.adam_team_start(len(cpus), ffi.new("int[]", list(cpus)), err)
        if team == ffi.NULL:
            raise OperationError(f"cannot start {len(cpus)} optimizer threads (errno {err[0]})")
        self._ffi, self._lib, self._team = ffi, lib, team
        self._stop = weakref.finalize(self, lib.adam_team_end, team)
        self.threads = len(cpus)
        self.cpus = tuple(cpus)

    def step(
        self, n: int, master: int, exp_avg: int, exp_avg_sq: int, max_exp_avg_sq: int | None,
        grad: int, grad_kind: int, weight: int | None, weight_kind: int, *, lr: float,
        betas: tuple[float, float], eps: float, weight_decay: float, decoupled: bool,
        maximize: bool, step: int, grad_scale: float,
    ) -> None:  # fmt: skip
        """One step over ``n`` fp32 elements at the addresses given (the caller owns
        the memory and keeps it alive); ``weight`` (or None) receives the new weights
        in ``weight_kind``. Releases the GIL while the threads run."""
        ffi = self._ffi

        def f32(address: int | None) -> Any:
            return ffi.NULL if address is None else ffi.cast("float *", address)

        rc = self._lib.adam_step(
            self._team, n, f32(master), f32(exp_avg), f32(exp_avg_sq), f32(max_exp_avg_sq),
            ffi.cast("void *", grad), grad_kind,
            ffi.NULL if weight is None else ffi.cast("void *", weight), weight_kind,
            lr, betas[0], betas[1], eps, weight_decay, int(decoupled), int(maximize), step,
            grad_scale,
        )  # fmt: skip
        if rc:
            raise InvalidRequestError(f"adam step {step}: bad precision or step number")

    def accumulate(self, n: int, home: int, incoming: int, kind: int, add: bool) -> float:
        """``n`` elements of precision ``kind`` at ``incoming`` added onto those at
        ``home`` (``add``) or copied there, rounded as ``add_`` rounds; returns the sum
        of the squares of the result. Releases the GIL while the threads run."""
        ffi = self._ffi
        sumsq = ffi.new("double *")
        rc = self._lib.grad_accumulate(
            self._team, n, ffi.cast("void *", home), ffi.cast("const void *", incoming),
            kind, int(add), sumsq,
        )  # fmt: skip
        if rc:
            raise InvalidRequestError(f"gradient sum: bad precision {kind} or out of memory")
        return float(sumsq[0])

    def close(self) -> None:
        """Stop the threads (waits for none: a step returns only when done)."""
        self._stop()
