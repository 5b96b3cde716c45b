"""Generated situations at every boundary: what test_fuzz.py does for the values people
type, here for the places those values meet. Commands are read from the CLI's own table
(test_fuzz's ``commands()``), so commands added later meet the same situations:

- every path pycxl writes (each option of type OutputFileType) pointed at special files
  this test makes in its own folder: character device nodes with /dev/null's and
  /dev/full's numbers, a FIFO, a UNIX socket, a folder, links; every path pycxl reads
  (InputFileType) pointed at the same;
- standard output closed, and opened on a full device;
- empty and blank values for every option and argument that takes a list;
- huge ranges for every node and CPU list, non-finite numbers for every number;
- copies of recorded trees with an attribute file corrupted (bytes that are not UTF-8,
  empty, missing, a folder, out-of-range numbers), read by the read-only commands and
  by the library.

Each must end as docs/cli.md says ("Exit codes" and the paragraph after it): a status
from its table and never 70, no traceback, the library raising only pycxl's errors, and
no special file, tree file or host setting changed. Every situation of a test is tried
and the failures are listed together. The number of situations tried is printed at the
end of the run (tests/unit/conftest.py); PYCXL_FUZZ_EXAMPLES scales the tree sample.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import stat
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from pycxl.cli import params as P
from pycxl.cli.main import run as console_script

import pycxl
from pycxl.base.errors import PycxlError
from pycxl.base.list_kinds import KIND_NAMES
from pycxl.base.sysfs import Sysfs
from tests.unit.test_fuzz import (
    CHILD_LIMIT_S,
    DOCUMENTED_EXITS,
    EXAMPLES,
    TREES,
    _bounded,
    command,
    commands,
    host_state,
    run_in_child,
)

SITUATIONS: Counter[str] = Counter()  # situations tried, by class (conftest reports them)
USAGE = 2
NOT_FOUND = 5
# Values for what a command requires, safe to run here: read-only targets, plans, `true`
SAFE = {"target": ["dram0"], "tier": ["dram0"], "gpu": ["gpu0"], "fmt": ["json"],
        "regions": ["all"], "command": ["--", "true"], "interval": ["0.05"],
        "count": ["1"], "memdevs": ["all"], "memdev": ["mem0"], "ports": ["all"],
        "buses": ["root0"], "dport": ["0000:0c:00.0"], "address": ["0x1000"],
        "infile": ["README.md"], "error": ["mem-correctable"], "layers": ["2"],
        "hidden": ["64"], "tokens": ["8"]}  # fmt: skip
LIST_TYPES = (P.NamesType, P.ObjectNamesType, P.IntListType, P.RatesType, P.WeightsType)
NUMBER_TYPES = (P.FiniteType, P.CountType, P.SizeType, P.IntListType, P.RatesType, P.PidType,
                click.types.IntParamType, click.types.FloatParamType)  # fmt: skip
PLURAL = re.compile(r"[A-Z_]*[A-RTV-Z]S")  # a metavar naming several: TARGETS, MODES
NODE_NAMED = {"target", "initiator", "load_on", "preferred", "targets"}
EMPTY = ["", " ", ",", " , "]
HUGE = ["0-99999999999999", "0-9999999", "99999999999999"]
NON_FINITE = ["inf", "-inf", "nan", "1e400"]


@pytest.fixture(scope="module")
def places() -> Iterator[dict[str, str]]:
    """Tree copies (one with a region, one fresh for region create) and a full device."""
    with tempfile.TemporaryDirectory(prefix="pycxl-sit-") as d:
        base = Path(d)
        for copy, tree in (("tree", "two-dev/region"), ("fresh", "two-dev/fresh")):
            _copy_tree(TREES / tree, base / copy)
        _mknod(base / "full", 7)
        yield {"tree": str(base / "tree"), "fresh": str(base / "fresh"), "full": str(base / "full")}


def _copy_tree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, symlinks=True)


def _mknod(path: Path, minor: int) -> None:
    """A character device node with /dev/null's (1, 3) or /dev/full's (1, 7) numbers."""
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))


# --- command lines --------------------------------------------------------------------------
def name(path: tuple[str, ...], argv: list[str]) -> str:
    return "pycxl " + " ".join([*path, *map(_quote, argv)])


def _quote(a: str) -> str:
    return a if a and re.fullmatch(r"[\w./:=,+-]+", a) else repr(a)


def tree_for(path: tuple[str, ...], places: dict[str, str]) -> dict[str, str]:
    """``places`` with the tree a command plans on: region create needs free memdevs."""
    return {**places, "tree": places["fresh"]} if path == ("region", "create") else places


def argv_with(path: tuple[str, ...], places: dict[str, str], opts: list[str] | None = None,
              arg: tuple[click.Parameter, list[str]] | None = None) -> list[str]:  # fmt: skip
    """Arguments of ``pycxl PATH``: its required options with safe values, what
    test_fuzz's ``_bounded`` adds (it sees ``opts``), ``opts`` last (so they win over a
    bound such as monitor's --duration), then its arguments: ``arg`` replaced by the
    values given, the others as required or as needed before it."""
    cmd = command(path)
    required: list[str] = []
    for p in cmd.params:
        if isinstance(p, click.Option) and p.required:
            assert p.name in SAFE, f"{name(path, [])}: add a safe value for {p.opts[0]} to SAFE"
            required += [p.opts[0], *SAFE[p.name]]
    extra = list(opts or [])
    argv = _bounded(path, [*required, *extra], tree_for(path, places))
    argv = [*required, *argv[len(required) + len(extra) :], *extra]
    if path == ("numa",) and "--tune-weights" in argv:
        argv.append("--dry-run")  # it measures, then writes this host's weights
    arguments = [p for p in cmd.params if isinstance(p, click.Argument)]
    last = arguments.index(arg[0]) if arg is not None else -1
    for i, p in enumerate(arguments):
        if arg is not None and p is arg[0]:
            argv += arg[1]
        elif p.required or i < last:
            assert p.name in SAFE or p.name == "pid", f"{name(path, [])}: a safe {p.name}?"
            argv += [str(os.getpid())] if p.name == "pid" else SAFE[p.name or ""]
    return argv


def problems_of(code: int, err: str) -> list[str]:
    """What no situation may end in: exit 70, a traceback, an exit outside the table."""
    out = []
    if code == 70 or "internal error" in err:
        out.append("internal error")
    if "Traceback" in err:
        out.append("traceback")
    if code not in DOCUMENTED_EXITS:
        out.append(f"exit {code} is not in docs/cli.md's table" +
                   (" (killed by the time limit)" if code == -signal.SIGALRM else ""))  # fmt: skip
    return out


def said(line: str, code: int, err: str, why: list[str]) -> str:
    tail = err.strip()[-600:].replace("\n", "\n    ")
    return f"{line}\n  exit {code}: {'; '.join(why)}\n  stderr: {tail}"


def usage_error_named(err: str, *names: str) -> bool:
    """A usage error's message, naming what was wrong (one of ``names``)."""
    return err.startswith("pycxl: error:") and any(n and n in err for n in names)


def state(folder: str, contents: bool = True) -> dict[str, tuple[object, ...]]:
    """Each entry under ``folder``, not following links: its type and mode, a node's
    numbers, a link's target, a file's bytes (``contents``) or its size and time of
    change (a tree's hundreds of files)."""
    out: dict[str, tuple[object, ...]] = {}
    for top, dirs, files in os.walk(folder):
        for entry in dirs + files:
            p = os.path.join(top, entry)
            st = os.lstat(p)
            what: tuple[object, ...] = (st.st_mode, st.st_rdev)
            if stat.S_ISLNK(st.st_mode):
                what += (os.readlink(p),)
            elif stat.S_ISREG(st.st_mode) and contents:
                with open(p, "rb") as f:
                    what += (f.read(),)
            elif stat.S_ISREG(st.st_mode):
                what += (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            out[os.path.relpath(p, folder)] = what
    return out


def changes(before: dict[str, tuple[object, ...]], after: dict[str, tuple[object, ...]]) -> str:
    gone = sorted(set(before) - set(after))
    new = sorted(set(after) - set(before))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    return "; ".join(f"{w}: {', '.join(v)}" for w, v in
                     (("removed", gone), ("appeared", new), ("changed", changed)) if v)  # fmt: skip


def params_of(path: tuple[str, ...]) -> list[click.Parameter]:
    return list(command(path).params)


def takes_value(p: click.Parameter) -> bool:
    if isinstance(p.type, click.types.UnprocessedParamType):
        return False
    return not (isinstance(p, click.Option) and (p.is_flag or p.count))


def how(
    p: click.Parameter, value: str
) -> tuple[list[str], tuple[click.Parameter, list[str]] | None]:
    """``value`` given to ``p``: as an option (opts) or as its argument."""
    if isinstance(p, click.Option):
        return [p.opts[0], value], None
    return [], (p, [value])


def names_of(p: click.Parameter) -> list[str]:
    ctx = click.Context(click.Command("x"))
    metavar = p.make_metavar(ctx) if isinstance(p, click.Argument) else (p.metavar or "")
    opts = getattr(p, "opts", [])
    words = [o.lstrip("-") for o in opts if o.startswith("--")]  # 'mode' for --mode
    return [*opts, *words, metavar, (p.name or "").upper(), p.name or ""]


# --- special files ----------------------------------------------------------------------------
def output_options() -> list[tuple[tuple[str, ...], click.Parameter]]:
    return [(path, p) for path in commands() for p in params_of(path)
            if isinstance(p.type, P.OutputFileType)]  # fmt: skip


def input_options() -> list[tuple[tuple[str, ...], click.Parameter]]:
    return [(path, p) for path in commands() for p in params_of(path)
            if isinstance(p.type, P.InputFileType)]  # fmt: skip


def suffix_of(p: click.Parameter) -> str:
    """An ending the option takes (.png for --plot, .prom for --textfile), so that a
    special file is refused for what it is, not for its name."""
    suffixes = p.type.suffixes() if getattr(p.type, "suffixes", None) else ()  # type: ignore[attr-defined]
    return ".png" if ".png" in suffixes else suffixes[0] if suffixes else ".out"


def make_specials(folder: Path, suffix: str) -> tuple[dict[str, Path], list[socket.socket]]:
    """Special files in ``folder``, each named with ``suffix``, and a regular file that two
    links point at (one at a file that does not exist)."""
    made = {"device node (/dev/null's numbers)": folder / f"null{suffix}",
            "device node (/dev/full's numbers)": folder / f"full{suffix}",
            "device node without the ending": folder / "null",
            "FIFO": folder / f"fifo{suffix}", "UNIX socket": folder / f"sock{suffix}",
            "folder": folder / f"dir{suffix}", "link to a regular file": folder / f"link{suffix}",
            "link to a missing file": folder / f"dangling{suffix}"}  # fmt: skip
    _mknod(made["device node (/dev/null's numbers)"], 3)
    _mknod(made["device node (/dev/full's numbers)"], 7)
    _mknod(made["device node without the ending"], 3)
    os.mkfifo(made["FIFO"])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(made["UNIX socket"]))
    sock.listen(1)
    made["folder"].mkdir()
    (folder / "target.txt").write_text("a regular file the links point at\n")
    made["link to a regular file"].symlink_to(folder / "target.txt")
    made["link to a missing file"].symlink_to(folder / "absent.txt")
    return made, [sock]


def _id(v: object) -> str:
    return " ".join(v) if isinstance(v, tuple) else v.opts[0]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("path", "param"), output_options() + input_options(), ids=_id)
def test_special_files_at_paths_pycxl_writes_or_reads(
    path: tuple[str, ...], param: click.Parameter, places: dict[str, str]
) -> None:
    """A path pycxl writes that is not a regular file (nor absent) is refused with exit 2
    before any work, and stays what it was; nothing else appears in its folder. A path
    pycxl reads must be a regular file: a node, FIFO, socket or folder is exit 2 (a FIFO
    would block, /dev/full's numbers read zeros for ever); a link to a file is read."""
    writes = isinstance(param.type, P.OutputFileType)
    failures = []
    before_host = host_state()
    with tempfile.TemporaryDirectory(prefix="pycxl-sit-") as d:
        made, sockets = make_specials(Path(d), suffix_of(param))
        try:
            before = state(d)
            for kind, special in made.items():
                SITUATIONS["special files"] += 1
                opts, arg = how(param, str(special))
                argv = argv_with(path, places, opts, arg)
                code, _, err = run_in_child([*path, *argv])
                why = problems_of(code, err)
                refused = writes or kind != "link to a regular file"
                if refused and code != USAGE:
                    why.append(f"{kind}: expected exit 2 (refused before any work)")
                if refused and not usage_error_named(err, str(special)):
                    why.append("the message does not name the path")
                after = state(d)
                if after != before:
                    why.append(f"the folder changed: {changes(before, after)}")
                    before = after
                if why:
                    failures.append(said(name(path, argv), code, err, why))
        finally:
            for s in sockets:
                s.close()
    assert host_state() == before_host
    assert not failures, "\n".join(failures)


# --- standard output closed or full -----------------------------------------------------------
def run_console_script(argv: list[str], stdout: str | None) -> tuple[int, str]:
    """``pycxl ARGV`` as the console script runs (pycxl.cli.main.run, then what the
    interpreter does at exit: flush standard output, where a failure is status 120), in
    a forked child whose fd 1 is closed (``stdout`` None: sys.stdout is None, as Python
    starts with >&-) or opened on ``stdout``; returns the exit status and stderr."""
    with tempfile.TemporaryFile("w+") as err:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 99
            try:
                os.dup2(err.fileno(), 2)
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 (pytest swapped it)
                if stdout is None:
                    os.close(1)
                    sys.stdout = None  # type: ignore[assignment]
                else:
                    fd = os.open(stdout, os.O_WRONLY)
                    os.dup2(fd, 1)
                    os.close(fd)
                    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                os.environ["PYCXL_BENCH_QUICK"] = "1"
                os.environ.pop("PYCXL_SYSROOT", None)
                sys.argv = ["pycxl", *argv]
                signal.alarm(CHILD_LIMIT_S)
                try:
                    console_script()
                    code = 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                except BaseException:
                    traceback.print_exc()  # what the interpreter prints, and status 1
                    code = 1
                if sys.stdout is not None:
                    try:
                        sys.stdout.flush()
                    except OSError as e:  # as the interpreter says it at exit
                        print(f"Exception ignored flushing sys.stdout: {e!r}", file=sys.stderr)
                        code = 120
                sys.stderr.flush()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        err.seek(0)
        return os.waitstatus_to_exitcode(status), err.read()


@pytest.mark.parametrize("path", commands(), ids=" ".join)
def test_standard_output_closed_or_full(path: tuple[str, ...], places: dict[str, str]) -> None:
    """With its minimal arguments, a command that prints ends with exit 1 and one line
    'pycxl: write error: ...' when standard output is closed or full; one that prints
    nothing (or whose output is not pycxl's: run's command) ends as it does with a
    standard output that works. A closed standard output may be found before the
    command runs (docs/cli.md): exit 1 and the one line, printing or not."""
    argv = argv_with(path, places)
    before_host = host_state()
    before_tree = state(tree_for(path, places)["tree"], contents=False)
    code0, out0, err0 = run_in_child([*path, *argv])
    failures = []
    if problems_of(code0, err0):
        failures.append(said(name(path, argv), code0, err0, problems_of(code0, err0)))
    for where, stdout in (("closed", None), ("full", places["full"])):
        SITUATIONS["stdout closed or full"] += 1
        code, err = run_console_script([*path, *argv], stdout)
        why = problems_of(code, err)
        lines = [line for line in err.splitlines() if line.startswith("pycxl: write error:")]
        if lines:
            if code != 1 or len(lines) != 1:
                why.append(f"a write error is exit 1 and one line, not exit {code}, {len(lines)}")
            if where == "full" and "No space left on device" not in lines[0]:
                why.append("a full device's write error says 'No space left on device'")
        elif out0:
            why.append(f"it prints {len(out0)} characters, and their loss was not said")
        elif code != code0:
            why.append(f"it prints nothing, and ended {code0} with a standard output")
        if "Exception ignored" in err:
            why.append("the interpreter's flush at exit failed")
        if why:
            failures.append(said(f"{name(path, argv)} (standard output {where})", code, err, why))
    assert state(tree_for(path, places)["tree"], contents=False) == before_tree
    assert host_state() == before_host
    assert not failures, "\n".join(failures)


# --- empty lists ----------------------------------------------------------------------------
def takes_list(p: click.Parameter) -> bool:
    """Whether ``p`` takes several values: a list type, repeated, an argument of any
    number, or a string option whose metavar says so (MIX[,MIX...], TARGETS)."""
    if not takes_value(p):
        return False
    if isinstance(p.type, LIST_TYPES) or p.multiple:
        return True
    if isinstance(p, click.Argument):
        return p.nargs == -1
    metavar = p.metavar or ""
    return isinstance(p.type, click.types.StringParamType) and (
        "," in metavar or "..." in metavar or PLURAL.fullmatch(metavar) is not None
    )


def list_params() -> list[tuple[tuple[str, ...], click.Parameter]]:
    return [(path, p) for path in commands() for p in params_of(path) if takes_list(p)]


@pytest.mark.parametrize("path", commands(), ids=" ".join)
def test_empty_values_for_every_list(path: tuple[str, ...], places: dict[str, str]) -> None:
    """'', ' ', ',' and ' , ' (an unset shell variable, a stray comma) given to every
    option or argument that takes a list: exit 2 saying which, and nothing written (the
    tree region commands and weights write to is compared, and this host)."""
    targets = [p for q, p in list_params() if q == path]
    if not targets:
        pytest.skip(f"pycxl {' '.join(path)} takes no list")
    tree = tree_for(path, places)["tree"]
    failures = []
    before_host = host_state()
    for p in targets:
        for value in EMPTY:
            SITUATIONS["empty lists"] += 1
            argv = argv_with(path, places, *how(p, value))
            writes = "--sysroot" in argv  # region commands and weights write a tree
            before = state(tree, contents=False) if writes else {}
            code, _, err = run_in_child([*path, *argv])
            why = problems_of(code, err)
            if code != USAGE:
                why.append("expected exit 2")
            elif not usage_error_named(err, *names_of(p), "empty", "nothing"):
                why.append("the message does not say which value")
            after = state(tree, contents=False) if writes else {}
            if after != before:
                why.append(f"the tree changed: {changes(before, after)}")
            if why:
                failures.append(said(name(path, argv), code, err, why))
    assert host_state() == before_host
    assert not failures, "\n".join(failures)


# --- huge ranges, non-finite numbers ------------------------------------------------------------
def node_params(path: tuple[str, ...]) -> list[click.Parameter]:
    """What takes node or CPU ids: node lists, number lists, targets and initiators, and
    list's object filters (-m 1 is mem1)."""
    return [p for p in params_of(path) if takes_value(p) and (
        isinstance(p.type, (P.NamesType, P.IntListType)) or p.name in NODE_NAMED
        or (path == ("list",) and p.multiple))]  # fmt: skip


def number_params(path: tuple[str, ...]) -> list[tuple[click.Parameter, str]]:
    """What takes a number, with how the number is written: alone, or as a node's value
    (--set-weights NODE=W, check -e NAME=SIZE)."""
    out = []
    for p in params_of(path):
        if takes_value(p) and isinstance(p.type, NUMBER_TYPES):
            out.append((p, "{}"))
        elif isinstance(p.type, P.WeightsType) or (isinstance(p, click.Option) and p.metavar
                                                   and p.metavar.endswith("=SIZE")):  # fmt: skip
            out.append((p, "dram0={}"))
    return out


@pytest.mark.parametrize("path", commands(), ids=" ".join)
def test_huge_ranges_and_non_finite_numbers(path: tuple[str, ...], places: dict[str, str]) -> None:
    """A node or CPU range far past the ids that exist is refused at once (exit 5, or 2
    where it is not a list of ids there), never expanded; inf, -inf, nan and 1e400 given
    to every number (seconds, counts, sizes, lists of them, stat's INTERVAL and COUNT,
    a PID, a node's weight or expected size) are a bad value: exit 2, also on a host
    without the hardware. The child's time limit is generous; no timing is asserted."""
    cases = [(p, v, (USAGE, NOT_FOUND)) for p in node_params(path) for v in HUGE]
    cases += [(p, form.format(v), (USAGE,)) for p, form in number_params(path) for v in NON_FINITE]
    if not cases:
        pytest.skip(f"pycxl {' '.join(path)} takes no ids or numbers")
    failures = []
    before_host = host_state()
    tree = tree_for(path, places)["tree"]
    for p, value, expected in cases:
        SITUATIONS["huge ranges" if value in HUGE else "non-finite numbers"] += 1
        opts, arg = how(p, value)
        if path == ("list",):
            opts += ["--sysroot", places["tree"]]
        argv = argv_with(path, places, opts, arg)
        writes = "--sysroot" in argv and path[0] != "list"  # region commands and weights
        before = state(tree, contents=False) if writes else {}
        code, _, err = run_in_child([*path, *argv])
        why = problems_of(code, err)
        if (state(tree, contents=False) if writes else {}) != before:
            why.append("the tree changed")
        if code not in expected:
            why.append(f"expected exit {' or '.join(map(str, expected))}")
        elif not err.startswith("pycxl: error:"):
            why.append("no error message")
        if "MemoryError" in err:
            why.append("MemoryError")
        if why:
            failures.append(said(name(path, argv), code, err, why))
    assert host_state() == before_host
    assert not failures, "\n".join(failures)


# --- corrupted recorded trees -----------------------------------------------------------------
def _write(data: bytes) -> Callable[[Path], None]:
    return lambda f: f.write_bytes(data)


def _folder(f: Path) -> None:
    f.unlink()
    f.mkdir()


CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    "bytes that are not UTF-8": _write(b"\xff\xfe\x80\n"),
    "empty": _write(b""),
    "missing": Path.unlink,
    "-1": _write(b"-1\n"),
    "nan": _write(b"nan\n"),
    "huge number": _write(b"99999999999999999999999999\n"),
    "a folder": _folder,
}
# what each attribute is of, by the nearest folder that names an object
OBJECTS = [("dax", r"dax\d+\.\d+|dax_region\d+"), ("region", r"region\d+"),
           ("decoder", r"decoder\d+\.\d+"), ("memdev", r"mem\d+"),
           ("port", r"(root|port|endpoint)\d+"), ("node", r"node\d+"),
           ("memory block", r"memory\d+"), ("cpu", r"cpu\d+"),
           ("pci device", r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"),
           ("memory tier", r"memory_tier\d+"), ("weights", r"weighted_interleave"),
           ("system lists", r"node|memory|cpu"), ("kernel mm", r"mm")]  # fmt: skip
# the attributes pycxl's figures come from, tried more often than the others
KEY_ATTRIBUTES = {"size", "numa_node", "target_node", "interleave_ways", "interleave_granularity",
                  "cpulist", "meminfo", "distance", "serial", "start", "target_list", "mode",
                  "dpa_size", "dpa_resource", "resource", "state", "online", "decode_state",
                  "commit", "valid_zones", "vmstat", "nodelist", "has_memory", "uuid",
                  "target_type", "cap_type2", "cap_ram", "memtier", "read_bandwidth"}  # fmt: skip
CORRUPT_TREES = [("two-dev", "region"), ("two-socket", "regions")]
READ_ONLY = [["list"], ["list", "-v", "--json"], ["check", "--no-health"],
             ["labels", "-F", "json", "--no-health"], ["numa"], ["stat"]]  # fmt: skip


def object_of(rel: str) -> str:
    parts = rel.split("/")
    if parts[0] == "proc":
        return "proc"
    for part in reversed(parts[:-1]):
        for what, pattern in OBJECTS:
            if re.fullmatch(pattern, part):
                return what
    return "other"


def attributes(tree: Path) -> dict[str, list[str]]:
    """The tree's attribute files under sys/ and proc/ (not through links: each once),
    by object; beside them a tree holds ndctl's output, which pycxl does not read."""
    by: dict[str, list[str]] = {}
    for rel, what in sorted(state(str(tree), contents=False).items()):
        if (stat.S_ISREG(int(what[0]))  # type: ignore[call-overload]
                and rel.startswith(("sys/", "proc/")) and not rel.endswith(".keep")):  # fmt: skip
            by.setdefault(object_of(rel), []).append(rel)
    return by


def corruptions(tree: Path, n: int, seed: str) -> list[tuple[str, str]]:
    """``n`` (file, corruption) pairs, the same every run: objects and corruptions taken in
    turn (every kind of object and every corruption is met), the file drawn within the
    object, a key attribute two times in three."""
    rng = random.Random(seed)
    by = attributes(tree)
    objects = sorted(by)
    rng.shuffle(objects)  # each tree starts elsewhere
    kinds = list(CORRUPTIONS)
    out: list[tuple[str, str]] = []
    for i in range(n):
        files = by[objects[i % len(objects)]]
        key = [f for f in files if f.rsplit("/", 1)[-1] in KEY_ATTRIBUTES]
        pool = key if key and rng.random() < 2 / 3 else files
        out.append((rng.choice(pool), kinds[(i + i // len(objects)) % len(kinds)]))
    return out


def read_in_child(tree: str) -> str | None:
    """The library reads ``tree`` in a forked child with the time limit: each call may
    raise pycxl's errors; anything else (or a hang, ended by the limit's SIGALRM) is
    returned, naming the call."""
    every = pycxl.ListRequest(kinds=frozenset(KIND_NAMES), targets=True, include_disabled=True)
    made: list[pycxl.System] = []
    calls: list[tuple[str, Callable[[], object]]] = [
        ("pycxl.snapshot(TREE, gpus=False)",
         lambda: made.append(pycxl.snapshot(tree, gpus=False))),
        ("pycxl.read_cxl(Sysfs(TREE))", lambda: pycxl.read_cxl(Sysfs(tree))),
        ("pycxl.list_json(that System, ListRequest(every kind, targets, disabled))",
         lambda: made and pycxl.list_json(made[0], every)),
    ]  # fmt: skip
    with tempfile.TemporaryFile("w+") as out:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 99
            try:
                signal.alarm(CHILD_LIMIT_S)
                code = 0
                for call, function in calls:
                    out.write(f"{call}\n")
                    out.flush()
                    try:
                        function()
                    except PycxlError:
                        pass  # refused with pycxl's own error: what the boundary promises
                    except BaseException:
                        out.write(traceback.format_exc())
                        code = 2
                        break
                out.flush()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        text = out.read()
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            return None
        last = [c for c, _ in calls if f"{c}\n" in text][-1]  # the call that failed or hung
        tail = "\n".join(text.split(last, 1)[1].strip().splitlines()[-14:])
        return f"status {code}, in {last}: {tail}"


def _restore(f: Path, data: bytes, mode: int) -> None:
    if f.is_dir():
        f.rmdir()
    f.write_bytes(data)
    os.chmod(f, mode)


@pytest.mark.parametrize(
    ("topology", "tree"), CORRUPT_TREES, ids=["/".join(t) for t in CORRUPT_TREES]
)
def test_corrupted_recorded_trees(topology: str, tree: str) -> None:
    """A copy of a recorded tree with one attribute file corrupted, read by every
    read-only command (--sysroot) and the library: any documented exit but 70, no
    traceback; the library raises only pycxl's errors; nothing in the tree is written."""
    source = TREES / topology / tree
    failures = []
    with tempfile.TemporaryDirectory(prefix="pycxl-sit-") as d:
        copy = Path(d) / "tree"
        _copy_tree(source, copy)
        for rel, kind in corruptions(source, max(EXAMPLES * 2 // 3, 1), f"{topology}/{tree}"):
            f = copy / rel
            data, mode = f.read_bytes(), f.stat().st_mode
            CORRUPTIONS[kind](f)
            before = state(str(copy), contents=False)
            what = f"[{rel}: {kind}, in a copy of {topology}/{tree}]"
            for argv in READ_ONLY:
                SITUATIONS["reads of corrupted trees"] += 1
                line = f"pycxl {' '.join(argv)} --sysroot TREE {what}"
                code, _, err = run_in_child([*argv, "--sysroot", str(copy)])
                if why := problems_of(code, err):
                    failures.append(said(line, code, err, why))
            SITUATIONS["reads of corrupted trees"] += 1
            if (raised := read_in_child(str(copy))) is not None:
                failures.append(f"the library {what}\n  raised, {raised}")
            if (after := state(str(copy), contents=False)) != before:
                failures.append(f"{what}: the tree changed: {changes(before, after)}")
            _restore(f, data, mode)
    assert not failures, "\n".join(failures)


# the attributes the figures come from (one file each, the first in the tree that matches)
KEY_FILES = [r".*/region\d+/(size|interleave_ways)", r".*/mem\d+/(numa_node|serial|ram/size)",
             r".*/decoder\d+\.\d+/(size|target_list)", r".*/dax\d+\.\d+/(target_node|size)",
             r".*/node/node\d+/(cpulist|meminfo)", r"sys/devices/system/node/online",
             r"sys/devices/system/memory/block_size_bytes", r".*/memory\d+/state",
             r".*/memory_tier\d+/nodelist"]  # fmt: skip


def key_files(tree: Path) -> list[str]:
    files = sorted(f for fs in attributes(tree).values() for f in fs)
    out = []
    for pattern in KEY_FILES:
        matched = [f for f in files if re.fullmatch(pattern, f)]
        names = {f.rsplit("/", 1)[-1] for f in matched}  # each attribute the pattern names
        out += [next(f for f in matched if f.endswith("/" + n)) for n in sorted(names)]
    return out


def test_every_corruption_of_the_key_attributes() -> None:
    """Every corruption of each attribute the figures come from (a region's size and
    ways, a memdev's node, a dax device's node and size, a node's CPUs and memory, the
    online nodes, the memory block size...), read by the library: only pycxl's errors,
    no hang (the time limit's SIGALRM)."""
    source = TREES / "two-dev" / "region"
    failures = []
    with tempfile.TemporaryDirectory(prefix="pycxl-sit-") as d:
        copy = Path(d) / "tree"
        _copy_tree(source, copy)
        for rel in key_files(source):
            f = copy / rel
            data, mode = f.read_bytes(), f.stat().st_mode
            for kind, corrupt in CORRUPTIONS.items():
                SITUATIONS["library reads of key attributes"] += 1
                corrupt(f)
                if (raised := read_in_child(str(copy))) is not None:
                    failures.append(f"the library [{rel}: {kind}, in a copy of two-dev/region]"
                                    f"\n  raised, {raised}")  # fmt: skip
                _restore(f, data, mode)
    assert not failures, "\n".join(failures)


def test_every_class_of_situation_reached() -> None:
    """Each class finds what it is for in the CLI's table (a rename there must not leave
    a class empty)."""
    assert len(output_options()) >= 7 and len(input_options()) >= 2
    assert len(list_params()) >= 25
    assert sum(len(node_params(p)) for p in commands()) >= 15
    assert sum(len(number_params(p)) for p in commands()) >= 25
    assert {"interval", "count"} <= {p.name for p, _ in number_params(("stat",))}
    tree = TREES / "two-dev" / "region"
    assert {o for o, _ in OBJECTS} <= set(attributes(tree))
    assert len(key_files(tree)) >= len(KEY_FILES) + 5
