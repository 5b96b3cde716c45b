"""Situations, one test per class: what a command meets besides its values (special
files where it writes, a full or closed standard output, empty lists from unset shell
variables, huge ranges, non-finite numbers, recorded trees beside the live host, filters
that name nothing) ends in a documented exit with one line naming the problem, and
changes nothing."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError, NotFoundError, PycxlError

ROOT = Path(__file__).resolve().parents[2]
TREES = ROOT / "tests" / "data" / "trees"
REGION = TREES / "two-dev" / "region"
TWO_SOCKET = TREES / "two-socket" / "fresh"


def pycxl_cli(*args: str, env: dict[str, str] | None = None,
              **kwargs: object) -> subprocess.CompletedProcess[str]:  # fmt: skip
    streams = {"stderr": subprocess.PIPE} if "stdout" in kwargs else {"capture_output": True}
    return subprocess.run([sys.executable, "-m", "pycxl.cli.main", *args], text=True,
                          check=False, env=env, timeout=300, **streams, **kwargs)  # type: ignore[call-overload]  # fmt: skip


def one_error_line(p: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    said = f"exit {p.returncode}\nstdout: {p.stdout[-500:]}\nstderr: {p.stderr}"
    assert p.returncode == code, said
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr, said
    for w in words:
        assert w in p.stderr, said


@pytest.fixture
def specials(tmp_path: Path) -> dict[str, Path]:
    """Special files of the test's own: device nodes as /dev/null and /dev/full are, a
    FIFO, a socket."""
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    out = {"null": tmp_path / "null", "full": tmp_path / "full.prom",
           "fifo": tmp_path / "fifo.prom", "sock": tmp_path / "sock.prom"}  # fmt: skip
    os.mknod(out["null"], 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(out["full"], 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    os.mkfifo(out["fifo"])
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(out["sock"]))
    s.close()
    return out


def _identity(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_mode, st.st_rdev, st.st_ino


@pytest.mark.parametrize(
    "args",
    [
        ["labels", "-F", "nfd", "--no-health", "-o", "{null}"],
        ["labels", "-F", "json", "--no-health", "-o", "{fifo}"],
        ["check", "--no-health", "--textfile", "{full}"],
        ["check", "--no-health", "--textfile", "{fifo}"],
        ["stat", "--textfile", "{sock}"],
        ["monitor", "--duration", "0.1", "--log", "{null}"],
    ],
)
def test_a_special_file_is_never_written(specials: dict[str, Path], args: list[str]) -> None:
    before = {name: _identity(p) for name, p in specials.items()}
    argv = [a.format(**{k: str(v) for k, v in specials.items()}) for a in args]
    p = pycxl_cli(*argv)
    one_error_line(p, 2, "pycxl writes only regular files")
    assert {name: _identity(p) for name, p in specials.items()} == before
    assert sorted(os.listdir(specials["null"].parent)) == sorted(
        p.name for p in specials.values()
    )  # no temporary file left beside them


def test_labels_dash_is_stdout_and_a_regular_file_is_replaced(tmp_path: Path) -> None:
    p = pycxl_cli("labels", "-F", "json", "--no-health", "-o", "-", "--sysroot", str(REGION))
    assert p.returncode == 0 and json.loads(p.stdout)["cxl_nodes"] == ["cxl0"], p.stderr
    out = tmp_path / "labels.json"
    out.write_text("old\n")
    p = pycxl_cli("labels", "-F", "json", "--no-health", "-o", str(out), "--sysroot", str(REGION))
    assert p.returncode == 0 and json.loads(out.read_text())["cxl_nodes"] == ["cxl0"], p.stderr


@pytest.mark.parametrize("args", [["list"], ["check", "-q", "--no-health"], ["numa"],
                                  ["stat", "--json"],
                                  ["labels", "-F", "slurm", "--no-health"]])  # fmt: skip
def test_a_full_or_closed_stdout_is_a_write_error(specials: dict[str, Path],
                                                  args: list[str]) -> None:  # fmt: skip
    with open(specials["full"], "w") as full:
        p = pycxl_cli(*args, stdout=full)
    assert p.returncode == 1 and p.stderr == "pycxl: write error: No space left on device\n", (
        p.stderr
    )
    p = pycxl_cli(*args, stdout=subprocess.DEVNULL)
    assert p.returncode in (0, 4), p.stderr  # /dev/null takes anything (check: 4, no CXL)
    # closed as a shell closes it (>&-): the interpreter starts with no standard output
    line = " ".join([sys.executable, "-m", "pycxl.cli.main", *args])
    closed = subprocess.run(["sh", "-c", f"exec {line} >&-"], capture_output=True, text=True,
                            check=False, timeout=120)  # fmt: skip
    assert closed.returncode == 1 and closed.stderr == (
        "pycxl: write error: Bad file descriptor (standard output is closed)\n"
    ), closed.stderr


def test_run_with_a_closed_stdout_leaves_it_to_the_command() -> None:
    p = subprocess.run(["sh", "-c", f"{sys.executable} -m pycxl.cli.main run -m dram0 -- "
                        "sh -c 'echo hi || exit 9' >&-"],
                       capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
    assert p.returncode == 9 and "Traceback" not in p.stderr, p.stderr  # echo met EBADF itself


@pytest.mark.parametrize(
    "args",
    [
        ["numa", "--set-weights", ""],
        ["numa", "--set-weights", ","],
        ["numa", "--set-weights", " "],
        ["numa", "--set-weights", "dram0=2,0=7"],  # one node weighed twice
        ["region", "destroy", ""],
        ["region", "destroy", "region0,,region1"],
        ["region", "create", ""],
        ["list", "-m", ""],
        ["list", "-r", " , "],
        ["run", "-m", "", "--", "true"],
    ],
)
def test_empty_lists_are_refused_and_nothing_is_written(tmp_path: Path, args: list[str]) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(REGION, tree, symlinks=True)
    weights = tree / "sys/kernel/mm/mempolicy/weighted_interleave"
    before = {f.name: f.read_bytes() for f in weights.iterdir()} if weights.is_dir() else {}
    extra = [] if args[0] == "run" else ["--sysroot", str(tree)]
    p = pycxl_cli(*args, *extra, *(["--dry-run"] if args[0] == "region" else []))
    one_error_line(p, 2)
    assert p.stderr.startswith("pycxl: error:"), p.stderr
    after = {f.name: f.read_bytes() for f in weights.iterdir()} if weights.is_dir() else {}
    assert after == before


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["run", "-m", "0-99999999999999", "--", "true"], 5),
        (["run", "-N", "0-9999999", "--", "true"], 5),
        (["run", "-C", "0-99999999999", "--", "true"], 2),
        (["stat", "inf", "2"], 2),
        (["stat", "nan", "2"], 2),
        (["monitor", "--duration", "nan"], 2),
        (["bench", "loaded-latency", "-t", "dram0", "--duration", "inf"], 2),
        (["bench", "loaded-latency", "-t", "dram0", "--knee", "nan"], 2),
        (["bench", "loaded-latency", "-t", "dram0", "--rates", "1", "--steps", "3"], 2),
        (["bench", "first-touch", "-t", "dram0", "--size", "5000"], 2),
    ],
)
def test_ranges_and_numbers_are_checked_before_anything_is_made(args: list[str],
                                                                code: int) -> None:  # fmt: skip
    p = pycxl_cli(*args)
    one_error_line(p, code)


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["region", "destroy", "all", "-d", "decoder9.9", "--dry-run"], 5, "decoder9.9"),
        (["region", "destroy", "region0", "-d", "decoder3.3", "--dry-run"], 5, "decoder3.3"),
        (["region", "destroy", "region7", "--dry-run"], 5, "region7"),
    ],
)
def test_a_filter_that_names_nothing_is_not_found(args: list[str], code: int, words: str) -> None:
    one_error_line(pycxl_cli(*args, "--sysroot", str(REGION)), code, words)


def test_a_filter_given_is_applied_in_either_spelling() -> None:
    for decoder in ("decoder0.0", "0.0"):
        p = pycxl_cli("region", "destroy", "all", "-d", decoder, "--dry-run", "--json",
                      "--sysroot", str(REGION))  # fmt: skip
        assert p.returncode == 0, p.stderr
        assert [d["region"] for d in json.loads(p.stdout)] == ["region0"]


def test_region_json_has_one_shape_per_command() -> None:
    """create: one object; destroy, disable, enable: a list, whatever the count."""
    for verb in ("destroy", "disable", "enable"):
        p = pycxl_cli("region", verb, "region0", "--dry-run", "--json", "--sysroot", str(REGION))
        assert p.returncode == 0 and isinstance(json.loads(p.stdout), list), p.stderr
    p = pycxl_cli("region", "create", "--dry-run", "--json", "--sysroot",
                  str(TREES / "two-dev" / "fresh"))  # fmt: skip
    assert p.returncode == 0 and isinstance(json.loads(p.stdout), dict), p.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["region", "create", "--zone", "movable", "--mode", "devdax"],
        ["region", "create", "--zone", "movable", "--no-online"],
        ["region", "enable", "region0", "--zone", "movable", "--no-online"],
        ["region", "enable", "region0", "--zone", "normal", "--mode", "devdax"],
    ],
)
def test_a_zone_where_the_memory_takes_none_is_refused(args: list[str]) -> None:
    tree = TREES / "two-dev" / ("fresh" if args[1] == "create" else "region")
    one_error_line(pycxl_cli(*args, "--dry-run", "--sysroot", str(tree)), 2, "zone")


@pytest.mark.parametrize(
    "args",
    [
        ["run", "-N", "dram1", "--", "true"],
        ["bench", "latency", "--from", "dram1", "-t", "dram0"],
        ["where", str(os.getpid())],
        ["pin-probe"],
        ["monitor", "--duration", "0.1"],
        ["numa", "--tune-weights", "all", "--dry-run"],
    ],
)
def test_a_recorded_tree_is_never_measured_bound_or_run_on(args: list[str]) -> None:
    env = {**os.environ, "PYCXL_SYSROOT": str(TWO_SOCKET)}
    one_error_line(pycxl_cli(*args, env=env), 2, str(TWO_SOCKET))


def test_libcxl_says_it_cannot_read_a_tree() -> None:
    p = pycxl_cli("list", "--backend", "libcxl", "--sysroot", str(REGION))
    one_error_line(p, 2, "libcxl", "recorded tree")


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["bench", "offload", "--mode", "bogus"], 2),
        (["bench", "offload", "--mode", "hbm,update"], 2),  # the update follows a backward pass
        (["bench", "bandwidth", "-t", "dram0", "--zero-copy"], 2),  # a GPU's kernels, not CPUs'
        (["bench", "transfer", "-g", "banana", "-t", "dram0"], 2),
        (["bench", "latency", "-t", "gpu7"], 5),
    ],
)
def test_arguments_are_checked_before_any_driver(args: list[str], code: int) -> None:
    from pycxl.pci.devices import nvidia_gpus

    if nvidia_gpus():
        pytest.skip("this host has GPUs: gpu7 may exist")
    one_error_line(pycxl_cli(*args), code)


def test_files_pycxl_reads_are_regular_utf8_files(tmp_path: Path) -> None:
    bad = tmp_path / "expect.txt"
    bad.write_bytes(b"cxl0=1G\nregions=\xff\xfe\n")
    one_error_line(pycxl_cli("check", "--no-health", "-f", str(bad)), 2, "line 2 is not UTF-8")
    fifo = tmp_path / "events"
    os.mkfifo(fifo)  # would block a reader for ever
    one_error_line(pycxl_cli("check", "--no-health", "--events", str(fifo)), 2,
                   "not a regular file")  # fmt: skip


def test_the_library_refuses_what_it_would_change_or_drop() -> None:
    system = pycxl.snapshot(gpus=False)
    cases: list[tuple[object, type[PycxlError], str]] = [
        (lambda: pycxl.snapshot(gpus="bogus"), InvalidRequestError, "gpus 'bogus'"),
        (lambda: pycxl.bench.measure_latency("dram0", system="x"), InvalidRequestError,
         "system='x'"),
        (lambda: pycxl.bench.measure_latency("dram0", loads=1, system=system),
         InvalidRequestError, "at least 16"),
        (lambda: pycxl.bench.measure_latency("dram0", loads=20, system=system),
         InvalidRequestError, "multiple of 16"),
        (lambda: pycxl.bench.measure_matrix(latency=False), InvalidRequestError,
         "nothing to measure"),
        (lambda: pycxl.snapshot(str(TREES / "two-dev/fresh"), explicit_cxl="0"),
         InvalidRequestError, "every node with CPUs"),
        (lambda: pycxl.RegionRequest(zone="movable", mode="devdax"), InvalidRequestError,
         "zone movable"),
        (lambda: system.memory_nodes("0-99999999999999"), NotFoundError, "do not exist"),
    ]  # fmt: skip
    from pycxl.numa.policy import Policy

    cases.append((lambda: Policy(99, (0,)), InvalidRequestError, "policy mode 99"))  # type: ignore[arg-type]
    for call, error, words in cases:
        with pytest.raises(error, match=words):
            call()  # type: ignore[operator]
    buf = pycxl.allocate("1M", "dram0")
    buf.close()
    with pytest.raises(InvalidRequestError, match="closed"):
        buf.pages_by_node()


def test_a_fifo_in_a_recorded_tree_is_an_error_not_a_hang(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(REGION, tree, symlinks=True)
    (serial,) = tree.glob("sys/devices/**/mem0/serial")
    serial.unlink()
    os.mkfifo(serial)  # a reader of it would wait for a writer for ever
    p = pycxl_cli("list", "--sysroot", str(tree))
    one_error_line(p, 1, "mem0/serial", "not a regular file")


def test_a_write_into_a_recorded_tree_never_leaves_it(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(REGION, tree, symlinks=True)
    weights = tree / "sys/kernel/mm/mempolicy/weighted_interleave"
    weights.mkdir(parents=True, exist_ok=True)
    victim = tmp_path / "victim"
    victim.write_text("1\n")
    (weights / "node0").unlink(missing_ok=True)
    (weights / "node0").symlink_to(victim)  # out of the tree: /sys/... on a planted tree
    p = pycxl_cli("numa", "--set-weights", "dram0=9", "--sysroot", str(tree))
    one_error_line(p, 1, "leads out of the recorded tree")
    assert victim.read_text() == "1\n"
