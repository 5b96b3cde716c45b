"""NUMA control on this machine's real nodes: placement checked page by page through
the kernel, policies set and restored, commands run under a policy, bad input."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from pycxl.errors import InvalidRequestError, NotFoundError, OperationError
from pycxl.numa import placement
from pycxl.numa.launch import LaunchRequest, plan_launch
from pycxl.numa.pages import NOT_PRESENT, process_usage
from pycxl.numa.policy import Mode, Policy, get_thread_policy, thread_policy
from pycxl.system import snapshot
from tests.kernel.kernel_helpers import pycxl_cli

PAGE = os.sysconf("SC_PAGE_SIZE")
MiB = 1 << 20


def first_dram() -> int:
    return snapshot(gpus=False).resolve("dram0").node or 0


def test_buffer_on_dram0_lands_there_page_by_page() -> None:
    node = first_dram()
    with placement.allocate(4 * MiB, "dram0") as buf:
        assert buf.policy == Policy.bind(node)
        assert buf.pages_by_node() == {node: 4 * MiB // PAGE}
        arr = buf.array("float64")
        arr[:] = 2.0
        assert arr.sum() == 2.0 * (4 * MiB // 8)
        assert placement.pages_by_node(arr[: PAGE // 8]) == {node: 1}
        with pytest.raises(OperationError, match="still used by arrays"):
            buf.close()
        del arr


def test_untouched_pages_are_reported_as_not_present() -> None:
    buf = placement.allocate(1 * MiB, "node0", populate=False)
    assert buf.pages_by_node() == {NOT_PRESENT: MiB // PAGE}
    buf.close()


def test_numpy_array_migrates_and_reports() -> None:
    node = first_dram()
    a = np.ones(MiB // 8)
    assert placement.migrate(a, "dram0") == {node: MiB // PAGE + (a.ctypes.data % PAGE > 0)}


def test_thread_policy_is_restored() -> None:
    before = get_thread_policy()
    with thread_policy(Policy.interleave(first_dram())):
        assert get_thread_policy().mode == Mode.INTERLEAVE
    assert get_thread_policy() == before


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: placement.allocate(MiB, "cxl7"), NotFoundError, r"'cxl7'; known: dram0"),
        (lambda: placement.allocate(1 << 50, "dram0"), InvalidRequestError, r"does not fit: node"),
        (lambda: placement.allocate(MiB), InvalidRequestError, r"give a target or a policy"),
        (lambda: Policy.bind(), InvalidRequestError, r"needs at least one node"),
        (lambda: plan_launch(LaunchRequest(("true",), membind=("dram0",), preferred="dram0")),
         InvalidRequestError, r"choose one of"),
        (lambda: plan_launch(LaunchRequest(("true",), interleave=("dram0",), weights=(3, 1))),
         InvalidRequestError, r"2 weight\(s\) for 1 interleave node\(s\)"),
        (lambda: plan_launch(LaunchRequest(("true",), weights=(3,))), InvalidRequestError,
         r"--weights applies to --interleave"),
        (lambda: process_usage(2**22 + 7), NotFoundError, r"unknown process"),
    ],
)  # fmt: skip
def test_bad_input(call: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()  # type: ignore[operator]


def test_run_passes_the_exit_status_and_binds_the_child() -> None:
    p = pycxl_cli("run", "--membind", "dram0", "--", "sh", "-c", "exit 7")
    assert p.returncode == 7
    node = first_dram()
    p = pycxl_cli("run", "-m", "dram0", "--", "grep", "Mems_allowed_list", "/proc/self/status")
    assert p.returncode == 0 and p.stdout.split()[-1] == str(node)
    p = pycxl_cli("run", "--", "no-such-command-here")
    assert p.returncode == 2 and "command not found" in p.stderr


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
    from pycxl.sysfs import parse_cpulist

    allowed = set(parse_cpulist(p.stdout.split()[-1])) & set(os.sched_getaffinity(0))
    assert p.returncode == 0 and allowed == set(cpus) & set(os.sched_getaffinity(0)), p.stdout
