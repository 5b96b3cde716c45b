"""NUMA control on this machine's real nodes: placement checked page by page through
the kernel, policies set and restored, commands run under a policy (as numactl: exec,
same PID), bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError, NotFoundError, OperationError
from pycxl.numa import placement
from pycxl.numa.pages import NOT_PRESENT, process_usage
from pycxl.numa.policy import Mode, Policy, get_thread_policy, thread_policy
from pycxl.resolve.system import snapshot
from tests.kernel.kernel_helpers import pycxl_cli

PAGE = os.sysconf("SC_PAGE_SIZE")
REGION_TREE = Path(__file__).parents[1] / "data" / "trees" / "two-dev" / "region"
MiB = 1 << 20


def first_dram() -> int:
    return snapshot(gpus=False).resolve("dram0").node or 0


def test_buffer_on_dram0_lands_there_page_by_page() -> None:
    node = first_dram()
    with pycxl.allocate("4M", "dram0") as buf:
        assert buf.policy == Policy.bind(node)
        assert buf.pages_by_node() == {node: 4 * MiB // PAGE}
        assert "4.00 MiB, bind" in repr(buf)
        arr = buf.array("float64")
        arr[:] = 2.0
        assert arr.sum() == 2.0 * (4 * MiB // 8)
        assert placement.pages_by_node(arr[: PAGE // 8]) == {node: 1}
        with pytest.raises(OperationError, match="still used by arrays"):
            buf.close()
        del arr


def test_a_large_buffer_is_touched_in_shares_every_page_on_its_node_and_zero() -> None:
    """Past one share (FIRST_TOUCH_SHARE) a bound buffer's pages are faulted in by
    several threads: each page still lands where the policy says, and reads zero."""
    node = first_dram()
    size = 2 * placement.FIRST_TOUCH_SHARE + 3 * PAGE  # a last share shorter than the rest
    with placement.allocate(size, [node]) as buf:
        assert buf.pages_by_node() == {node: size // PAGE}
        arr = buf.array("uint64")
        assert not arr.any()
        del arr


def test_the_id_floor_takes_node_ids() -> None:
    node = first_dram()
    with placement.allocate(MiB, [node]) as buf:
        assert buf.pages_by_node() == {node: MiB // PAGE}
        assert buf.migrate([node]) == {node: MiB // PAGE}


def test_untouched_pages_are_reported_as_not_present() -> None:
    buf = pycxl.allocate(1 * MiB, "node0", populate=False)
    assert buf.pages_by_node() == {NOT_PRESENT: MiB // PAGE}
    buf.close()


def test_numpy_array_migrates_and_reports() -> None:
    node = first_dram()
    a = np.ones(MiB // 8)
    assert pycxl.migrate(a, "dram0") == {node: MiB // PAGE + (a.ctypes.data % PAGE > 0)}


def test_thread_policy_is_restored() -> None:
    before = get_thread_policy()
    with thread_policy(Policy.interleave(first_dram())):
        assert get_thread_policy().mode == Mode.INTERLEAVE
    assert get_thread_policy() == before


def test_node_lists_resolve_like_numactl() -> None:
    s = snapshot(gpus=False)
    ids = tuple(t.node.id for t in s.nodes if t.node.has_memory)
    assert s.memory_nodes("all") == ids
    assert s.memory_nodes(f"0-{ids[-1]}") == ids
    assert s.memory_nodes(["dram0", "0"]) == (ids[0],)
    cpus = tuple(sorted(c for t in s.nodes for c in t.node.cpus))
    assert s.cpus("all") == cpus and s.cpus(f"cpu{cpus[0]}") == (cpus[0],)
    plan = s.launch_settings(preferred_many=["all"], physcpubind=[str(cpus[0])])
    assert plan.policy == Policy.preferred_many(*ids) and plan.cpus == (cpus[0],)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: pycxl.allocate(MiB, "cxl7"), NotFoundError, r"'cxl7'; known: dram0"),
        (lambda: pycxl.allocate(1 << 50, "dram0"), InvalidRequestError, r"does not fit: node"),
        (lambda: pycxl.allocate(MiB), InvalidRequestError, r"give a target or a policy"),
        (lambda: pycxl.allocate("0", "dram0"), InvalidRequestError, r"size must be positive"),
        (lambda: pycxl.allocate(MiB, "dram0", huge="bogus"), InvalidRequestError,
         r"huge='bogus': use one of auto, none, thp, hugetlb"),
        (lambda: placement.allocate(MiB, [999]), InvalidRequestError, r"999 are not online"),
        (lambda: Policy.bind(), InvalidRequestError, r"needs at least one node"),
        (lambda: snapshot(gpus=False).launch_settings(membind=["dram0"], preferred="dram0"),
         InvalidRequestError, r"choose one memory policy"),
        (lambda: snapshot(str(REGION_TREE), gpus=False).launch_settings(preferred="all"),
         InvalidRequestError, r"--preferred takes one node, not 2"),
        (lambda: snapshot(gpus=False).cpus("9999"), InvalidRequestError, r"CPU 9999 is not online"),
        (lambda: snapshot(gpus=False).memory_nodes("0-99"), NotFoundError,
         r"NUMA node range '0-99': nodes? [0-9-]+ do(es)? not exist"),
        (lambda: process_usage(2**22 + 7), NotFoundError, r"unknown process"),
    ],
)  # fmt: skip
def test_bad_input(call: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()  # type: ignore[operator]


def test_run_execs_with_the_exit_status_and_binds_the_command() -> None:
    p = pycxl_cli("run", "--membind", "dram0", "--", "sh", "-c", "exit 7")
    assert p.returncode == 7
    node = first_dram()
    p = pycxl_cli("run", "-m", "dram0", "--", "grep", "Mems_allowed_list", "/proc/self/status")
    assert p.returncode == 0 and p.stdout.split()[-1] == str(node)
    p = pycxl_cli("run", "--", "no-such-command-here")
    assert p.returncode == 127 and "command not found: no-such-command-here" in p.stderr
    p = pycxl_cli("run", "--", "/etc/hostname")
    assert p.returncode == 126 and "cannot execute" in p.stderr


def test_run_keeps_the_pid_and_the_command_gets_signals() -> None:
    """numactl's contract: pycxl becomes the command, so a signal reaches it directly
    and nothing is left behind (no parent to orphan it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pycxl.cli.main", "run", "-m", "dram0", "--", "sleep", "30"]
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/comm") as f:
            if f.read().strip() == "sleep":
                break
        time.sleep(0.05)
    with open(f"/proc/{proc.pid}/comm") as f:
        assert f.read().strip() == "sleep"  # same PID, now the command
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["-C", "1"], 2, "Missing argument 'COMMAND"),
        (["-Z", "1", "true"], 2, "No such option '-Z'"),
        (["-m", "dram0", "-i", "dram0", "true"], 2, "choose one memory policy"),
        (["-C", "9999", "true"], 2, "CPU 9999 is not online"),
        (["-N", "dram0", "-C", "0", "true"], 2, "choose one of --cpunodebind and --physcpubind"),
        (["-m", "cxl9", "true"], 5, "unknown target 'cxl9'"),
    ],
)
def test_run_rejects_what_numactl_rejects(args: list[str], code: int, message: str) -> None:
    p = pycxl_cli("run", *args)
    assert p.returncode == code and message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_run_physcpubind_localalloc_and_weighted_interleave_forms() -> None:
    cpu = min(os.sched_getaffinity(0))
    p = pycxl_cli("run", "-C", str(cpu), "--", "grep", "Cpus_allowed_list", "/proc/self/status")
    assert p.returncode == 0 and p.stdout.split()[-1] == str(cpu), p.stderr
    p = pycxl_cli("run", "-l", "--", "grep", "-m1", "heap", "/proc/self/numa_maps")
    assert p.returncode == 0 and " local " in p.stdout, p.stdout
    p = pycxl_cli("run", "-w", "all", "--", "grep", "-m1", "heap", "/proc/self/numa_maps")
    if "weighted interleave needs Linux 6.9" in p.stderr:
        pytest.skip("this kernel has no weighted interleave")
    assert p.returncode == 0 and "weighted interleave" in p.stdout, p.stdout + p.stderr


def test_where_and_numa_commands_agree_with_the_kernel() -> None:
    p = pycxl_cli("where", str(os.getpid()), "--json")
    assert p.returncode == 0, p.stderr
    usage = {r["node"]: r["bytes"] for r in json.loads(p.stdout)}
    ours = process_usage(os.getpid())
    assert usage.keys() == ours.keys() and all(
        abs(usage[n] - ours[n]) <= ours[n] // 10 for n in ours
    )
    doc = json.loads(pycxl_cli("numa", "--json").stdout)
    out = subprocess.run(["numactl", "-H"], capture_output=True, text=True, check=True).stdout
    for n in doc:
        assert f"node {n['node']} size: {n['mem_total'] >> 20} MB" in out
        assert n["name"].startswith(("dram", "cxl", "node"))
    assert pycxl_cli("where", "0").returncode == 2


def test_kernel_refusal_is_explained() -> None:
    from pycxl.numa.policy import set_thread_policy

    before = get_thread_policy()
    with pytest.raises(OperationError, match=r"refused set_mempolicy\(bind 63\).*offline or have"):
        set_thread_policy(Policy.bind(63))
    assert get_thread_policy() == before


def test_run_preferred_and_cpunodebind() -> None:
    node = first_dram()
    p = pycxl_cli(
        "run", "--preferred", "dram0", "--", "grep", "-m1", "heap", "/proc/self/numa_maps"
    )
    assert p.returncode == 0 and f"prefer:{node}" in p.stdout, p.stdout
    cpus = snapshot(gpus=False).nodes[0].node.cpus
    p = pycxl_cli(
        "run", "--cpunodebind", "dram0", "--", "grep", "Cpus_allowed_list", "/proc/self/status"
    )
    from pycxl.base.sysfs import parse_cpulist

    allowed = set(parse_cpulist(p.stdout.split()[-1])) & set(os.sched_getaffinity(0))
    assert p.returncode == 0 and allowed == set(cpus) & set(os.sched_getaffinity(0)), p.stdout
