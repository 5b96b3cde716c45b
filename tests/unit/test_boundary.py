"""Every kind of value a user types, refused or taken where it comes in, one test per
class of input: the sysroot, CPU and node ranges, files to read and to write, process
ids, library arguments of the wrong type; and what commands do with the process and the
system around them (signals before exec, tracefs, the check's exit status)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError, NotFoundError
from pycxl.resolve.system import snapshot
from tests.nobody import as_nobody

ROOT = Path(__file__).resolve().parents[2]
TREES = ROOT / "tests" / "data" / "trees"
REGION = TREES / "two-dev" / "region"


def pycxl_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycxl.cli.main", *args], capture_output=True,
                          text=True, check=False, env=env, timeout=300)  # fmt: skip


def no_cxl_tree(tmp_path: Path) -> Path:
    """A recorded tree with its NUMA nodes and CPUs but no CXL bus."""
    shutil.copytree(TREES / "two-dev/fresh/sys/devices/system", tmp_path / "sys/devices/system",
                    symlinks=True)  # fmt: skip
    return tmp_path


# --- the sysroot ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["list", "--sysroot", "/nonexistent"], {}, "--sysroot /nonexistent does not exist"),
        (["list"], {"PYCXL_SYSROOT": "/nonexistent"}, "PYCXL_SYSROOT /nonexistent"),
        (["check", "--sysroot", "/nonexistent"], {}, "--sysroot /nonexistent"),
        (["stat", "--sysroot", "/etc/hostname"], {}, "is not a directory"),
        (["numa"], {"PYCXL_SYSROOT": "/nonexistent"}, "PYCXL_SYSROOT /nonexistent"),
        (["bench", "latency", "-t", "dram0"], {"PYCXL_SYSROOT": "/nonexistent"},
         "PYCXL_SYSROOT /nonexistent"),
    ],
)  # fmt: skip
def test_a_missing_sysroot_is_an_error_not_a_host_without_cxl(
    args: list[str], env: dict[str, str], named: str
) -> None:
    p = pycxl_cli(*args, env={**os.environ, **env})
    assert p.returncode == 2 and named in p.stderr, p.stderr
    assert p.stdout == "" and "Traceback" not in p.stderr
    with pytest.raises(InvalidRequestError, match="sysroot /nonexistent does not exist"):
        pycxl.snapshot("/nonexistent")


# --- CPU and node lists --------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["-C", "1-0"], 2, "'1-0' is a reversed range: write 0-1"),
        (["-m", "1-0"], 2, "'1-0' is a reversed range"),
        (["-N", "3-1"], 2, "'3-1' is a reversed range"),
        (["-C", "0-x"], 2, "'0-x' is not an id or a range"),
        (["-m", "0-63"], 5, "unknown NUMA node range '0-63': nodes"),
    ],
)
def test_cpu_and_node_ranges_are_checked_before_anything_runs(
    args: list[str], code: int, message: str
) -> None:
    p = pycxl_cli("run", *args, "--", "true")
    assert p.returncode == code and message in p.stderr, p.stderr


def test_the_library_checks_ranges_the_same_way() -> None:
    s = snapshot(gpus=False)
    with pytest.raises(InvalidRequestError, match="reversed range"):
        s.cpus("1-0")
    with pytest.raises(InvalidRequestError, match="reversed range"):
        s.memory_nodes("1-0")
    with pytest.raises(NotFoundError, match="NUMA node range '0-63'"):
        s.memory_nodes("0-63")
    assert s.resolve(0).node == 0 and s.memory_nodes(0) == (0,)


# --- library arguments of the wrong type ----------------------------------------------
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: pycxl.allocate(1.5, "dram0"), "size 1.5: give bytes as a whole number"),
        (lambda: pycxl.allocate(None, "dram0"), "size None"),  # type: ignore[arg-type]
        (lambda: pycxl.allocate("1M", 1.5), "target 1.5"),  # type: ignore[arg-type]
        (lambda: snapshot(gpus=False).resolve(None), "target None"),  # type: ignore[arg-type]
        (lambda: snapshot(gpus=False).memory_nodes([None]), "target None"),  # type: ignore[list-item]
        (lambda: pycxl.migrate(123, "dram0"), "int 123: not a buffer"),
        (lambda: pycxl.bench.measure_latency("dram0", samples=1.5), "samples"),  # type: ignore[arg-type]
        (lambda: pycxl.bench.measure_latency(None), "target None"),  # type: ignore[arg-type]
        (lambda: pycxl.snapshot(3), "sysroot 3"),  # type: ignore[arg-type]
    ],
)  # fmt: skip
def test_library_arguments_of_the_wrong_type_are_pycxl_errors(call: object, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        call()  # type: ignore[operator]


def test_dir_shows_public_names_only_and_bench_exports_loaded_latency() -> None:
    assert dir(pycxl) == sorted(pycxl.__all__)
    assert not {n for n in dir(pycxl) if n != "__version__" and n.startswith("_")}
    assert {"TYPE_CHECKING", "annotations", "lazy_exports"}.isdisjoint(dir(pycxl))
    assert {"measure_loaded_latency", "LoadedLatencyResult", "LoadedPoint"} <= set(
        pycxl.bench.__all__
    )
    for module in (pycxl, pycxl.bench):
        for name in module.__all__:
            assert getattr(module, name) is not None
    # the names imported for type checkers are the names the table loads
    tree = ast.parse((ROOT / "pycxl/__init__.py").read_text())
    checked = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.If)
               for sub in ast.walk(node) if isinstance(sub, ast.ImportFrom)
               for a in sub.names}  # fmt: skip
    assert checked | {"cxl", "gpu", "numa", "testbed"} == set(pycxl._LAZY)


# --- files to read: the check's inputs ------------------------------------------------
def test_check_refuses_an_event_log_that_is_not_json_lines(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"event": "x"}\nnot json\n{"event": "y"}\n')
    p = pycxl_cli("check", "--sysroot", str(REGION), "--events", str(bad))
    assert p.returncode == 2 and "line 2 is not a JSON object" in p.stderr, p.stderr
    cut = tmp_path / "cut.jsonl"  # a crash while writing leaves the last line short
    cut.write_text('{"event": "x"}\n{"event": "cxl_mem')
    p = pycxl_cli("check", "--sysroot", str(REGION), "--no-health", "--events", str(cut))
    assert p.returncode == 0, p.stderr
    for missing, words in ((tmp_path / "none.jsonl", "no such file"), (tmp_path, "directory")):
        p = pycxl_cli("check", "--events", str(missing))
        assert p.returncode == 2 and words in p.stderr, p.stderr
    p = pycxl_cli("check", "-f", str(tmp_path / "none.txt"))
    assert p.returncode == 2 and "no such file" in p.stderr


def test_expectations_that_held_pass_a_host_without_cxl(tmp_path: Path) -> None:
    tree = str(no_cxl_tree(tmp_path))
    p = pycxl_cli("check", "-q", "--sysroot", tree, "--expect", "dram0=1G", "--events", "")
    assert p.returncode == 0 and "pycxl check: ok" in p.stdout, p.stdout + p.stderr
    p = pycxl_cli("check", "-q", "--sysroot", tree, "--events", "")
    assert p.returncode == 4 and "no-cxl" in p.stdout  # nothing expected: says there is no CXL
    p = pycxl_cli("check", "-q", "--sysroot", tree, "--expect", "cxl0=1G", "--events", "")
    assert p.returncode == 7 and "not present" in p.stdout


# --- files to write: --plot -----------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("missing/x.png", "does not exist"),
        ("", "the path is empty"),
        (".", "is a directory"),
        ("x.xyz", "must end in"),
        ("noext", "must end in"),
        ("link.png", "symbolic link"),
    ],
)
def test_plot_paths_are_refused_before_anything_is_measured(
    tmp_path: Path, name: str, words: str
) -> None:
    (tmp_path / "link.png").symlink_to(tmp_path / "elsewhere.png")
    path = str(tmp_path / name) if name else ""
    p = pycxl_cli("bench", "latency", "-t", "dram0", "--size", "16K", "-n", "1", "--plot", path)
    assert p.returncode == 2 and words in p.stderr, p.stderr
    assert p.stdout == ""  # refused before the measurement, not after
    assert not (tmp_path / "elsewhere.png").exists()


def test_a_plot_is_written_in_the_format_its_name_says(tmp_path: Path) -> None:
    out = tmp_path / "lat.svg"
    p = pycxl_cli("bench", "latency", "-t", "dram0", "--size", "16K", "-n", "1", "--plot",
                  str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert out.read_text().lstrip().startswith("<?xml") and "<svg" in out.read_text()
    assert [f.name for f in tmp_path.iterdir()] == ["lat.svg"]  # no temporary left


# --- process ids: pycxl where ----------------------------------------------------------
def _as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    return as_nobody(list(args))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_where_of_another_users_process_needs_root() -> None:
    p = _as_nobody("where", str(os.getpid()))
    assert p.returncode == 3 and "run as root" in p.stderr, p.stderr


def test_where_refuses_what_is_not_a_pid_and_says_why_root_cannot_read() -> None:
    for bad in ("0", "x", "1.5"):
        p = pycxl_cli("where", bad)
        assert p.returncode == 2 and "process id" in p.stderr and bad in p.stderr, p.stderr
    p = pycxl_cli("where", "-3")  # an option, as for any command
    assert p.returncode == 2 and "'-3'" in p.stderr
    hidden = [pid for pid in ("1", "2") if not os.access(f"/proc/{pid}/numa_maps", os.R_OK)]
    if os.geteuid() == 0 and hidden:
        p = pycxl_cli("where", hidden[0])
        assert p.returncode == 1 and "even to root" in p.stderr and "run as root" not in p.stderr


# --- pycxl run: signals as numactl leaves them -------------------------------------------
def _bash(line: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env,
                          check=False, timeout=60)  # fmt: skip


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl compares")
def test_run_ends_pipelines_and_killed_commands_as_numactl_does() -> None:
    cases = {
        "pipeline": "{} yes | head -1; echo ${{PIPESTATUS[0]}}",
        "killed": "{} sh -c 'kill -TERM $$'; echo $?",
        "dispositions": "{} grep -E '^Sig(Ign|Blk)' /proc/self/status",
        "nohup keeps SIGHUP ignored": "trap '' HUP; {} grep -E '^SigIgn' /proc/self/status",
    }
    for what, line in cases.items():
        ours = _bash(line.format("pycxl run -m dram0 --"))
        theirs = _bash(line.format("numactl -m 0 --"))
        assert (ours.stdout, ours.stderr) == (theirs.stdout, theirs.stderr), what
    assert _bash(cases["pipeline"].format("pycxl run --")).stdout == "y\n141\n"


def test_no_child_process_keeps_pythons_signal_changes() -> None:
    """pycxl execs in one place (after restoring signals); its subprocesses keep
    subprocess's restore_signals=True (SIGPIPE, SIGXFSZ) and run no code before exec."""
    execs: list[str] = []
    for path in sorted((ROOT / "pycxl").rglob("*.py")) + sorted((ROOT / "cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("exec") and isinstance(
                node.value, ast.Name) and node.value.id == "os":  # fmt: skip
                execs.append(path.name)
            if isinstance(node, ast.keyword) and node.arg in ("restore_signals", "preexec_fn"):
                pytest.fail(f"{path}: {node.arg}= changes what a child inherits")
    assert execs == ["launch.py"]
    launch = (ROOT / "pycxl/numa/launch.py").read_text()
    assert launch.index("restore_default_signals()\n    try:") < launch.index("os.execv(")


# --- tracefs: left as it was found -------------------------------------------------------
MONITOR_FOR_A_WHILE = """
import json, os, subprocess, sys, time
def tracefs():
    with open("/proc/self/mounts") as f:
        return [line for line in f if line.split()[2] == "tracefs"]
before = tracefs()
proc = subprocess.Popen([sys.executable, "-m", "pycxl.cli.main", "monitor", "--duration", "3"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
deadline = time.monotonic() + 30
line = ""
while "monitoring" not in line and time.monotonic() < deadline:
    line = proc.stderr.readline()
if "monitoring" not in line:
    proc.kill()
    print(json.dumps({"skip": line + proc.stderr.read()}))
    sys.exit()
during = tracefs()
rc = proc.wait(timeout=30)
after = tracefs()
base = "/sys/kernel/tracing/instances"
left = [d for d in (os.listdir(base) if os.path.isdir(base) else [])
        if d.startswith(f"pycxl-{proc.pid}-")]
print(json.dumps({"rc": rc, "before": before, "during": during, "after": after, "left": left}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="the monitor needs root; unshare gives it its own mounts")  # fmt: skip
def test_monitor_leaves_tracefs_mounted_as_it_found_it() -> None:
    # in a mount namespace of its own: what other programs mount meanwhile is not its
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                        MONITOR_FOR_A_WHILE], capture_output=True, text=True, timeout=90,
                       check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    if "skip" in r:
        pytest.skip(f"the monitor cannot run here: {r['skip']}")
    assert r["rc"] == 0 and r["after"] == r["before"], r
    assert r["during"] if not r["before"] else r["during"] == r["before"], r  # mounted meanwhile
    assert r["left"] == [], r


# --- list -v, -vv, -vvv as cxl list ------------------------------------------------------
def test_list_verbose_levels_are_cxl_lists() -> None:
    def kinds(*args: str) -> list[str]:
        p = pycxl_cli("list", *args, "--json", "--sysroot", str(REGION))
        assert p.returncode == 0, p.stderr
        return [next(iter(group)) for group in json.loads(p.stdout)]

    assert kinds("-v") == ["buses", "ports", "endpoints", "memdevs", "root decoders",
                           "port decoders", "endpoint decoders", "regions"]  # fmt: skip
    assert "memdevs" not in kinds("-v", "-D")  # as cxl list: named kinds replace the default
    one = json.loads(pycxl_cli("list", "-v", "--json", "--sysroot", str(REGION)).stdout)
    two = json.loads(pycxl_cli("list", "-vv", "--json", "--sysroot", str(REGION)).stdout)
    decoders = {k: len(g[k]) for g in one for k in g}["endpoint decoders"]
    assert {k: len(g[k]) for g in two for k in g}["endpoint decoders"] > decoders  # -i
    assert one[-1]["regions"][0]["mappings"] is not None  # -T
    three = json.loads(pycxl_cli("list", "-vvv", "--json", "--sysroot", str(REGION)).stdout)
    assert "dax" in [next(iter(g)) for g in three]
    memdev = next(g["memdevs"] for g in three if "memdevs" in g)[0]
    assert {"health", "health_unsupported"} & set(memdev)
    assert {"media_errors", "media_errors_unsupported"} & set(memdev)
    p = pycxl_cli("-v", "list", "-v", "-m", "mem0", "--json", "--sysroot", str(REGION))
    groups = {k: v for g in json.loads(p.stdout) for k, v in g.items()}  # both -v: each its own
    assert [m["memdev"] for m in groups["memdevs"]] == ["mem0"] and "buses" in groups


def test_list_device_answers_of_a_recorded_tree_are_not_asked_of_this_machine() -> None:
    """-H, -A and -L read the devices' mailboxes: a recorded tree's devices are not here,
    and this machine's devices of the same names must not answer for them."""
    p = pycxl_cli("list", "-M", "-H", "-A", "-L", "--json", "--sysroot", str(REGION))
    assert p.returncode == 0, p.stderr
    for m in json.loads(p.stdout):
        for key in ("health", "alert_config", "media_errors"):
            assert key not in m and "recorded tree" in m[f"{key}_unsupported"], m
    table = pycxl_cli("list", "-M", "-H", "--sysroot", str(REGION))
    assert table.returncode == 0 and "its devices are not here to ask" in table.stderr


def test_list_verbose_on_a_host_without_cxl_says_why_it_is_empty(tmp_path: Path) -> None:
    p = pycxl_cli("list", "-v", "--sysroot", str(no_cxl_tree(tmp_path)))
    assert p.returncode == 0 and p.stdout.rstrip().endswith(
        "absent: no CXL bus: the CXL drivers are not loaded or there is no CXL hardware "
        "(modprobe cxl_acpi cxl_pci cxl_mem)"
    ), p.stdout
    p = pycxl_cli("list", "-v", "--json", "--sysroot", str(no_cxl_tree(tmp_path / "j")))
    assert p.returncode == 0 and json.loads(p.stdout) == []  # as cxl list: nothing to list


# --- a working set that fits in the cache -------------------------------------------------
def test_an_arena_in_the_last_level_cache_is_said_in_the_table_and_json() -> None:
    from pycxl.measure.conditions import last_level_cache

    (r,) = pycxl.bench.measure_latency("dram0", size="16K", samples=1, loads=1 << 14)
    assert r.fits_in_cache is True and r.last_level_cache == last_level_cache()
    p = pycxl_cli("bench", "latency", "-t", "dram0", "--size", "16K", "-n", "1")
    assert "16.00 KiB*" in p.stdout and "last-level cache: the figure is the cache's" in p.stdout
    doc = json.loads(pycxl_cli("bench", "bandwidth", "-t", "dram0", "--size", "64K", "-n", "1",
                               "--kernel", "copy", "--json").stdout)  # fmt: skip
    assert doc[0]["fits_in_cache"] is True
    big = 2 * last_level_cache()
    if big <= 256 << 20:  # beyond the cache, where that is cheap to allocate
        (r,) = pycxl.bench.measure_latency("dram0", size=big, samples=1, loads=1 << 14)
        assert r.fits_in_cache is False
