"""GPU enumeration on a machine with a GPU: what pycxl reads without CUDA (NVML, the
driver's files) against what the CUDA driver reports and what nvidia-smi prints, and no
CUDA in a process that ran ``pycxl list``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from pycxl.base.sysfs import Sysfs
from pycxl.gpu import read_gpus
from pycxl.gpu.inventory import GpuDevice
from pycxl.gpu.nvml import FP32_LANES_PER_SM

pytestmark = pytest.mark.gpu


def _smi() -> list[dict[str, str]]:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not installed")
    fields = "uuid,name,pci.bus_id,memory.total"
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    keys = fields.split(",")
    return [dict(zip(keys, (v.strip() for v in line.split(",")), strict=True))
            for line in out.splitlines() if line.strip()]  # fmt: skip


def _by_bus(devices: tuple[GpuDevice, ...]) -> dict[str, GpuDevice]:
    return {g.pci_bus_id: g for g in devices}


def test_gpus_match_nvidia_smi() -> None:
    inv = read_gpus()
    smi = {g["uuid"]: g for g in _smi()}
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        assert len(inv.devices) == len(smi)
    assert inv.absent_reason is None and len(inv.devices) > 0
    for g in inv.devices:
        ref = smi[g.uuid]
        assert g.source == "nvml"
        assert g.name == ref["name"]
        assert g.pci_bus_id == ref["pci.bus_id"].lower()[-12:]
        # CUDA's count leaves out what the driver reserves; nvidia-smi counts the whole
        # framebuffer (H200: 143157 vs 143771 MiB). Allow that reserve, no more.
        smi_bytes = int(ref["memory.total"]) << 20
        assert g.total_memory is not None and 0.98 * smi_bytes <= g.total_memory <= smi_bytes
        assert g.compute_capability is not None and g.compute_capability[0] >= 5
        assert g.numa_node is not None
    assert [g.pci_bus_id for g in inv.devices] == sorted(g.pci_bus_id for g in inv.devices)


def test_nvml_facts_equal_the_cuda_drivers() -> None:
    """Every fact list shows without CUDA is the one CUDA reports (--cuda)."""
    fast = read_gpus(via="nvml")
    cuda = read_gpus(via="cuda")
    assert fast.absent_reason is None and cuda.absent_reason is None
    assert fast.driver_version == cuda.driver_version and cuda.driver_version
    assert list(_by_bus(fast.devices)) == list(_by_bus(cuda.devices))
    for bus, c in _by_bus(cuda.devices).items():
        n = _by_bus(fast.devices)[bus]
        assert (n.source, c.source) == ("nvml", "cuda")
        same = ("index", "name", "uuid", "pci_bus_id", "total_memory", "compute_capability",
                "numa_node")  # fmt: skip
        assert {k: getattr(n, k) for k in same} == {k: getattr(c, k) for k in same}
        if n.ordinal is not None:
            assert n.ordinal == c.ordinal
        # the SM count from NVML's cores, where the capability is in the table (9.0 is)
        if n.compute_capability in FP32_LANES_PER_SM:
            assert n.sm_count_source == "nvml-cores" and n.sm_count == c.sm_count
        else:
            assert n.sm_count is None and n.sm_count_source is None
        if n.pageable_memory_access is not None:  # NVML's addressing mode, newer drivers
            assert n.pageable_memory_access == c.pageable_memory_access
        assert n.numa_node_source in ("driver", "sysfs", "only-cpu-node")
        assert c.l2_cache and c.async_engines is not None and n.l2_cache is None


def test_driver_files_agree_with_nvml() -> None:
    from pycxl.gpu import procfs

    files = procfs.read_inventory(Sysfs("/"), os.environ)
    assert files is not None
    nvml = _by_bus(read_gpus(via="nvml").devices)
    for g in files.devices:
        n = nvml[g.pci_bus_id]
        assert (g.index, g.name, g.uuid, g.ordinal) == (n.index, n.name, n.uuid, n.ordinal)


# A child process runs commands in-process, then reports whether pycxl called cuInit,
# whether a CUDA context exists (a context maps /dev/nvidia-uvm into the process; NVML
# alone opens that device but does not map it) and whether NVML lists the process among
# those holding a context on any GPU. Whether libcuda.so is mapped says nothing: on the
# H200 host's driver nvmlInit itself maps it.
_CHILD = textwrap.dedent(
    """
    import json, os, sys
    from pycxl.cli.main import main
    for args in json.loads(sys.argv[1]):
        rc = main(args)
        assert rc in (0, 4, 6, 7), (args, rc)
    if len(sys.argv) > 2:  # the positive control: a context, made as pinning makes it
        from pycxl.gpu.context import GpuContext
        ctx = GpuContext(0)
    maps = open("/proc/self/maps").read()
    driver = sys.modules.get("pycxl.gpu.driver")
    from pycxl.gpu.nvml import session
    pids = []
    with session() as (ffi, lib):
        count = ffi.new("unsigned int *")
        lib.nvmlDeviceGetCount_v2(count)
        for i in range(count[0]):
            dev = ffi.new("nvmlDevice_t *")
            if lib.nvmlDeviceGetHandleByIndex_v2(i, dev) != 0:
                continue
            n = ffi.new("unsigned int *", 64)
            procs = ffi.new("nvmlProcessInfo_t[64]")
            if lib.nvmlDeviceGetComputeRunningProcesses_v3(dev[0], n, procs) == 0:
                pids += [procs[k].pid for k in range(n[0])]
    print(json.dumps({
        "cuinit": bool(driver and driver.cuda_started()),
        "context": "nvidia-uvm" in maps,
        "pid": os.getpid(),
        "pids": pids,
    }))
    """
)


def _child(commands: list[list[str]], context: bool = False) -> dict[str, object]:
    args = [sys.executable, "-c", _CHILD, json.dumps(commands)] + (["ctx"] if context else [])
    p = subprocess.run(args, capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    out: dict[str, object] = json.loads(p.stdout.splitlines()[-1])
    return out


def test_list_and_check_start_no_cuda() -> None:
    quick = _child([["list"], ["list", "-G", "--json"], ["check", "-q"]])
    # the controls: --cuda calls cuInit; a context is seen in the maps and by NVML
    assert _child([["list", "-G", "--cuda"]])["cuinit"] is True
    held = _child([["list"]], context=True)
    assert held["context"] is True
    assert quick["cuinit"] is False, "pycxl list/check initialised CUDA"
    assert quick["context"] is False, "pycxl list/check made a CUDA context"
    if held["pid"] not in held["pids"]:  # type: ignore[operator]
        pytest.skip("NVML reports other process ids here (a PID namespace): maps checked")
    assert quick["pid"] not in quick["pids"]  # type: ignore[operator]


def _list_json(env: dict[str, str], *extra: str) -> list[dict[str, object]]:
    p = _list(env, *extra)
    assert p.returncode == 0, p.stderr
    doc: list[dict[str, object]] = json.loads(p.stdout)
    return doc


def _list(env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycxl.cli.main", "list", "-G", "--json",
                           *extra], capture_output=True, text=True, check=False,
                          env={**os.environ, **env})  # fmt: skip


def _shown(p: subprocess.CompletedProcess[str]) -> tuple[int, object]:
    """What list -G showed: the GPUs' names, UUIDs, addresses and ordinals, or how it failed."""
    if p.returncode != 0:
        return p.returncode, (p.stderr.strip().splitlines() or [""])[-1]
    keys = ("gpu", "uuid", "pci_bus_id", "ordinal")
    return 0, [{k: g[k] for k in keys} for g in json.loads(p.stdout)]


def test_cuda_visible_devices_as_cuda_applies_it() -> None:
    (first, *_) = read_gpus(via="nvml").devices
    # those pycxl settles itself, then those it leaves to CUDA (a duplicate, no such index)
    specs = ["", "0", first.uuid, first.uuid[:12], "0,0", "99", f"{first.uuid},99"]
    for spec in specs:
        env = {"CUDA_VISIBLE_DEVICES": spec}
        assert _shown(_list(env)) == _shown(_list(env, "--cuda")), spec
    assert _shown(_list({"CUDA_VISIBLE_DEVICES": "0"}))[1] != []


def test_cli_lists_gpus() -> None:
    doc = _list_json({})
    assert doc[0]["gpu"] == "gpu0" and doc[0]["total_memory"] and doc[0]["source"] == "nvml"
    assert list(doc[0]) == list(_list_json({}, "--cuda")[0])


_READ = textwrap.dedent(
    """
    import dataclasses, json, sys
    from pycxl.gpu import nvml_session
    from pycxl.base.sysfs import Sysfs
    if sys.argv[1] == "thread":
        nvml_session.begin_reading(Sysfs())
    from pycxl.gpu import read_gpus
    inv = read_gpus(via="nvml")
    print(json.dumps({"thread": nvml_session._starter is not None,
                      "devices": [dataclasses.asdict(g) for g in inv.devices],
                      "version": inv.driver_version, "absent": inv.absent_reason}))
    """
)


def test_nvml_started_on_a_thread_reads_what_an_inline_start_reads() -> None:
    """list starts NVML on a thread while it reads the rest; what it then reads is what
    a start in line reads."""
    out = {}
    for how in ("thread", "inline"):
        p = subprocess.run([sys.executable, "-c", _READ, how], capture_output=True,
                           text=True, check=False)  # fmt: skip
        assert p.returncode == 0, p.stderr
        out[how] = json.loads(p.stdout.splitlines()[-1])
    assert (out["thread"]["thread"], out["inline"]["thread"]) == (True, False)
    assert out["thread"]["devices"] and out["thread"]["absent"] is None
    for key in ("devices", "version", "absent"):
        assert out["thread"][key] == out["inline"][key]
