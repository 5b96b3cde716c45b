"""Generated input at every boundary: arguments for every option of every command (the
commands are read from the CLI's own table, so commands added later are fuzzed too) and
for every public library function, good and bad values mixed.

Each input must end as documented: no exit 70 and no traceback; a usage error (exit 2)
says which value is wrong; the library raises only pycxl's errors. Nothing on this host
changes: commands that write run with --dry-run, or against a copy of a recorded sysfs
tree. What a command could leave behind in the kernel is compared before and after in
state the test owns, so other programs on the host cannot fail it: each command runs in a
mount namespace of its own (its mounts under /sys before and after, inside it, and its own
tracefs instances after it), and the host's weighted-interleave weights are compared.
The number of inputs tried is printed at the end of the run.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import os
import shutil
import signal
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pycxl.cli.main import COMMANDS, cli, main

import pycxl
from pycxl.base.errors import PycxlError

ROOT = Path(__file__).resolve().parents[2]
TREES = ROOT / "tests" / "data" / "trees"
EXAMPLES = int(os.environ.get("PYCXL_FUZZ_EXAMPLES", "25"))  # per command or function
DOCUMENTED_EXITS = {0, 1, 2, 3, 4, 5, 6, 7, 126, 127, 130}
TRIED = {"cli": 0, "library": 0}
EXITS: Counter[int] = Counter()  # exit statuses of the generated command lines
CHILD_LIMIT_S = 30  # a generated command that runs longer than this is a failure

FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))  # fmt: skip


@pytest.fixture(scope="module")
def places() -> Iterator[dict[str, str]]:
    """Paths the generated values point at: a tree copy, a folder, a file, a link."""
    with tempfile.TemporaryDirectory(prefix="pycxl-fuzz-") as d:
        base = Path(d)
        tree = base / "tree"
        shutil.copytree(TREES / "two-dev" / "region", tree, symlinks=True)
        (base / "log.jsonl").write_text('{"event": "x"}\n')
        (base / "notjson.txt").write_text("not json\n")
        (base / "link.png").symlink_to(base / "elsewhere.png")
        yield {"tree": str(tree), "dir": str(base), "file": str(base / "log.jsonl"),
               "notjson": str(base / "notjson.txt"), "link": str(base / "link.png"),
               "out": str(base / "out.png"), "prom": str(base / "out.prom")}  # fmt: skip


# --- values -----------------------------------------------------------------------------
NAMES = ["dram0", "cxl0", "node0", "node1", "gpu0", "cpu0", "all", "mem0", "region0",
         "decoder0.0", "root", "0", "1", "0-1", "1-0", "0,1", "dram0,cxl0", "-1", "cxl9",
         "DRAM0", " dram0 ", ",", "0-", "-", "1.5", "none"]  # fmt: skip
SIZES = ["16K", "64K", "1M", "4096", "0", "-1", "1.5", "1.5K", "0x1000", "1e3", "12Q", "1T",
         "999999999999999999999", "4k", "2m", "K", " 1M "]  # fmt: skip
NUMBERS = ["1", "2", "3", "0", "-1", "1.5", "nan", "inf", "-inf", "0.01", "1e9", "x", "010"]
WORDS = ["read", "3:1", "all", "copy", "triad", "h2d", "normal", "movable", "ram", "pmem",
         "system-ram", "devdax", "4k", "2m", "cxl0=1G", "dram0=1G", "regions=1", "memdevs=x",
         "NODE=W", "dram0=1", "cxl0=-1", "dpa=4096", "health-status=4", "x=", "=1"]  # fmt: skip
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)


def values(places: dict[str, str], pick: str) -> st.SearchStrategy[str]:
    """Strings for one option: those its kind expects, mixed with any other text."""
    paths = st.sampled_from([places["dir"], places["file"], places["notjson"], places["link"],
                             places["out"], places["prom"], "/nonexistent/x.png", "",
                             places["dir"] + "/x.svg", places["tree"]])  # fmt: skip
    common = [st.sampled_from(NAMES), st.sampled_from(SIZES), st.sampled_from(NUMBERS),
              st.sampled_from(WORDS), TEXT]  # fmt: skip
    first = {"path": paths, "size": st.sampled_from(SIZES), "count": st.sampled_from(NUMBERS),
             "name": st.sampled_from(NAMES)}.get(pick)  # fmt: skip
    # half the time a value of the option's kind, else anything
    return st.one_of(first if first is not None else paths, st.one_of(common))


def kind_of(param: click.Parameter) -> str:
    name = (param.name or "").lower()
    if name in ("plot", "textfile", "log", "event_log", "expect_file", "sysroot"):
        return "path"
    if "size" in name or name == "granularity":
        return "size"
    if name in (
        "samples",
        "count",
        "steps",
        "threads",
        "load_threads",
        "ways",
        "timeout",
        "interval",
        "duration",
        "knee",
        "expect_regions",
        "expect_memdevs",
        "pid",
    ):
        return "count"
    return "name"


# --- commands -----------------------------------------------------------------------------
def commands() -> list[tuple[str, ...]]:
    """Every command path, from the CLI's own table (groups walked)."""
    ctx = click.Context(cli)
    out: list[tuple[str, ...]] = []

    def walk(cmd: click.Command, path: tuple[str, ...]) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(sub, (*path, name))
        else:
            out.append(path)

    for name in sorted(COMMANDS):
        cmd = cli.get_command(ctx, name)
        assert cmd is not None
        walk(cmd, (name,))
    return out


def command(path: tuple[str, ...]) -> click.Command:
    ctx = click.Context(cli)
    cmd: click.Command | None = cli
    for name in path:
        assert isinstance(cmd, click.Group)
        cmd = cmd.get_command(ctx, name)
    assert cmd is not None
    return cmd


@st.composite
def argv_for(draw: st.DrawFn, path: tuple[str, ...], places: dict[str, str]) -> list[str]:
    """Options of ``path`` in any order, each with a generated value."""
    cmd = command(path)
    argv: list[str] = []
    args: list[str] = []
    for param in cmd.params:
        if isinstance(param, click.Argument):
            if path == ("stat",):  # INTERVAL alone reports forever, as vmstat does
                if param.name == "interval":
                    args += draw(st.sampled_from([[], ["0.05", "2"], ["0.05", "1"], ["0", "1"],
                                 ["-1", "1"], ["x"], ["0.05", "0"], ["0.05", "x"], ["nan", "1"],
                                 ["inf", "1"], ["1e-9", "1"], ["0.05", "1.5"]]))  # fmt: skip
                continue
            if param.name == "command":  # what pycxl run / testbed start
                args += draw(st.sampled_from([["--", "true"], ["--", "false"], ["--", "sh", "-c",
                             "exit 3"], ["--", "/nonexistent"], []]))  # fmt: skip
            elif draw(st.booleans()):
                args += draw(st.lists(values(places, kind_of(param)), min_size=1, max_size=2))
            continue
        assert isinstance(param, click.Option)
        if not draw(st.integers(0, 2)):  # most options are left out
            continue
        flag = draw(st.sampled_from(param.opts + param.secondary_opts))
        if param.is_flag or param.count:
            argv.append(flag)
        else:
            argv += [flag, draw(values(places, kind_of(param)))]
    return _bounded(path, argv, places) + args


def _bounded(path: tuple[str, ...], argv: list[str], places: dict[str, str]) -> list[str]:
    """What keeps a generated command from changing this host or running for long: region
    commands plan only (--dry-run) on a tree copy; weights are written to the tree copy;
    the monitor and top stop; the testbed lists its topologies instead of booting; bench,
    stat and loaded latency get short defaults (PYCXL_BENCH_QUICK, a point's duration)."""
    if path[0] == "region" or (path[0] == "numa" and "--set-weights" in argv):
        argv += ["--dry-run"] if path[0] == "region" else []
        argv += ["--sysroot", places["tree"]]
    if path[0] == "monitor":
        argv += ["--duration", "0.2"]
    if path[0] == "top":  # reports forever by default, as dmon does
        argv += ["-c", "1", "-d", "0.05"]
    if path[0] == "testbed" and "--inject" not in argv:
        argv += ["--list-topologies"]
    if path == ("bench", "loaded-latency"):
        argv += ["--duration", "0.02", "--steps", "2", "--load-threads", "1"]
    if path == ("bench", "latency") and "--sweep" in argv:
        argv += ["--size", "64K"]
    return argv


def run_in_child(argv: list[str]) -> tuple[int, str, str]:
    """``pycxl ARGV`` in a forked child (pycxl run execs: it must not replace this test),
    in a mount namespace of its own, with its output captured and a time limit; exit
    LEFT_BEHIND (its stderr says what) where it left a mount or trace instance behind."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 99
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (pytest swapped them)
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                os.environ["PYCXL_BENCH_QUICK"] = "1"
                os.environ.pop("PYCXL_SYSROOT", None)
                owned = own_mount_namespace()
                before = kernel_state() if owned else ([], set())
                signal.alarm(CHILD_LIMIT_S)
                code = main(argv)
                sys.stdout.flush()
                left = left_behind(before) if owned else ""
                if left:
                    print(left, file=sys.stderr)
                    code = LEFT_BEHIND
                sys.stderr.flush()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return os.waitstatus_to_exitcode(status), out.read(), err.read()


def host_state() -> str:
    """What a fuzzed command must not change on this host that it cannot own: the
    weighted-interleave weights (the commands write them only to a tree copy)."""
    weights_dir = "/sys/kernel/mm/mempolicy/weighted_interleave"
    weights = ""
    if os.path.isdir(weights_dir):
        for name in sorted(os.listdir(weights_dir)):
            with open(f"{weights_dir}/{name}") as f:
                weights += f"{name}={f.read()}"
    return weights


_CLONE_NEWNS, _MS_REC, _MS_PRIVATE = 0x00020000, 0x4000, 1 << 18
LEFT_BEHIND = 97  # a child's exit status: it left mounts or a trace instance behind


def own_mount_namespace() -> bool:
    """Move this (child) process into a mount namespace of its own, shared with nothing
    (root only): what it mounts stays in it, and what other programs mount on the host
    meanwhile does not come in. False where that is not possible (not root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        return False
    return libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) == 0


def sys_mounts() -> list[str]:
    with open("/proc/self/mounts") as f:
        return sorted(line for line in f if line.split()[1].startswith("/sys"))


def my_trace_instances() -> set[str]:
    """Trace instances named for this process's PID. tracefs is one for the whole
    kernel: looked at through a mount of this namespace's own, made for the look where
    none is; an instance a dead process of the same PID left is there before too."""
    tracing = "/sys/kernel/tracing"
    libc = ctypes.CDLL(None, use_errno=True)
    mounted = not os.path.isdir(f"{tracing}/instances") and libc.mount(
        b"nodev", tracing.encode(), b"tracefs", 0, None
    ) == 0  # fmt: skip
    mine = f"pycxl-{os.getpid()}-"
    found = set()
    if os.path.isdir(f"{tracing}/instances"):
        found = {n for n in os.listdir(f"{tracing}/instances") if n.startswith(mine)}
    if mounted:
        libc.umount2(tracing.encode(), 0)
    return found


def kernel_state() -> tuple[list[str], set[str]]:
    """What a command could leave behind in the kernel: mounts under /sys, and trace
    instances named for this process."""
    return sys_mounts(), my_trace_instances()


def left_behind(before: tuple[list[str], set[str]]) -> str:
    """What this process left in the kernel since ``before`` (kernel_state())."""
    mounts, instances = before
    said = [f"mount left: {m.strip()}" for m in sys_mounts() if m not in mounts]
    said += [f"trace instance left: {n}" for n in sorted(my_trace_instances() - instances)]
    return "\n".join(said)


@pytest.mark.parametrize("path", commands(), ids=" ".join)
def test_every_option_of_every_command(path: tuple[str, ...], places: dict[str, str]) -> None:
    before = host_state()

    @FUZZ
    @given(argv=argv_for(path, places))
    def one(argv: list[str]) -> None:
        TRIED["cli"] += 1
        code, out, err = run_in_child([*path, *argv])
        EXITS[code] += 1
        said = f"pycxl {' '.join(path)} {argv!r}: exit {code}\nstdout:{out[-800:]}\nstderr:{err}"
        assert code != 70 and "Traceback" not in err and "internal error" not in err, said
        assert code in DOCUMENTED_EXITS or (path == ("run",) and code in (1, 3)), said
        if code == 2:
            assert err.startswith("pycxl: error:") or "Usage:" in err, said
            # the value, or the item of a list that is wrong ('dram0' of '-s dram0,cxl0')
            words = [w for a in [*argv, *path] for w in (a, *a.split(","))]
            named = [w for w in words if w.strip() and w.strip() in err]
            assert named or "empty" in err or "Missing" in err, said

    one()
    assert host_state() == before


# --- the library --------------------------------------------------------------------------
SYSTEM_FREE = {"snapshot", "read_cxl", "create_region", "destroy_region", "enable_region",
               "disable_region", "map_dax"}  # fmt: skip


def library_functions() -> list[tuple[str, Callable[..., Any]]]:
    """Every public function and class of pycxl and pycxl.bench that takes what people
    type (names, sizes, counts, words)."""
    out: list[tuple[str, Callable[..., Any]]] = []
    for module in (pycxl, pycxl.bench):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) and name not in ("list_json", "matrix_pairs"):
                out.append((f"{module.__name__}.{name}", obj))
    for name in ("resolve", "pair", "host_pair", "memory_nodes", "cpu_nodes", "cpus", "gpu",
                 "gpus_named", "launch_settings", "tier", "tier_name"):  # fmt: skip
        out.append((f"System.{name}", getattr(pycxl.System, name)))
    out += [("RegionRequest", pycxl.RegionRequest), ("ListRequest", pycxl.ListRequest)]
    return out


ANY = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 1 << 20), st.sampled_from([2**40, 2**70]),
    st.floats(allow_nan=True),
    st.sampled_from(NAMES + SIZES + NUMBERS + WORDS), TEXT, st.binary(max_size=4),
    st.lists(st.sampled_from(NAMES), max_size=3), st.tuples(st.sampled_from(NAMES)),
    st.dictionaries(st.sampled_from(WORDS), st.integers(), max_size=2),
)  # fmt: skip
SMALL_SIZES = st.one_of(st.sampled_from(["16K", "64K", "1M", 4096, 65536]), ANY)


def argument(name: str, places: dict[str, str]) -> st.SearchStrategy[Any]:
    """A value for a parameter, by what its name says it takes."""
    if name in ("dry_run",):
        return st.just(True)
    if name in ("system", "sysfs", "policy", "progress", "loaded"):
        return st.just(None)  # objects and callbacks the caller builds; the matrix unloaded
    if name in ("sysroot",):
        return st.sampled_from([places["tree"], "/nonexistent", places["file"], "", 3])
    if "size" in name or name in ("top", "granularity"):
        return SMALL_SIZES
    if name in ("samples", "loads", "steps", "load_threads", "threads", "ways"):
        return st.one_of(st.integers(-2, 3), ANY)
    if name in ("seconds", "knee"):
        return st.one_of(st.sampled_from([0.01, 0.02, 1.5]), ANY)
    if name in ("rates", "fractions"):
        return st.one_of(st.lists(st.floats(-1, 2e9), max_size=2), ANY)
    return ANY


@pytest.mark.parametrize("name,function", library_functions(), ids=lambda v: str(v)[:40])
def test_every_public_function(name: str, function: Callable[..., Any],
                               places: dict[str, str]) -> None:  # fmt: skip
    params = [p for p in inspect.signature(function).parameters.values()
              if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]  # fmt: skip
    system = pycxl.snapshot(gpus=False)
    before = host_state()

    @FUZZ
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        TRIED["library"] += 1
        kwargs = {}
        # what writes to the kernel (regions, device operations) plans on a tree copy
        writes = {"dry_run", "sysroot"} <= {p.name for p in params}
        for p in params:
            required = p.default is inspect.Parameter.empty
            if required or (writes and p.name in ("dry_run", "sysroot")) or (
                data.draw(st.integers(0, 2), label=f"give {p.name}") == 0
            ):  # fmt: skip
                kwargs[p.name] = data.draw(argument(p.name, places), label=p.name)
        if writes:
            kwargs["dry_run"] = True
            kwargs["sysroot"] = places["tree"]
            if "request" in kwargs and not isinstance(kwargs["request"], pycxl.RegionRequest):
                kwargs["request"] = pycxl.RegionRequest()
        bound = function.__get__(system) if name.startswith("System.") else function
        os.environ["PYCXL_BENCH_QUICK"] = "1"
        try:
            result = bound(**kwargs)
            if hasattr(result, "close"):
                result.close()
        except PycxlError:
            pass  # refused with pycxl's own error: what the boundary promises
        finally:
            os.environ.pop("PYCXL_BENCH_QUICK", None)

    in_own_namespace(one)
    assert host_state() == before


def in_own_namespace(run: Callable[[], None]) -> None:
    """``run()`` in a forked child in a mount namespace of its own (as each command line
    runs), failing here with its error, or with what it left in the kernel; the inputs
    it tried are counted here."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        failure = ""
        try:
            owned = own_mount_namespace()
            before = kernel_state() if owned else ([], set())
            try:
                run()
            except BaseException:
                failure = traceback.format_exc()
            failure += left_behind(before) if owned else ""
            with os.fdopen(write_end, "w") as out:
                json.dump({"tried": TRIED["library"], "failure": failure}, out)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        got = answer.read()
    os.waitpid(pid, 0)
    assert got, "the child ended without an answer"
    report = json.loads(got)
    TRIED["library"] = report["tried"]
    assert not report["failure"], report["failure"]


def test_the_fuzzing_reached_every_command_and_function() -> None:
    """Reported at the end of the run (tests/unit/conftest.py) as 'fuzz: N inputs'."""
    assert len(commands()) >= 19 and len(library_functions()) >= 30
