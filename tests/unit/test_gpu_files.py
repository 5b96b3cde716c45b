"""GPUs from the NVIDIA driver's files, on the tree recorded on the H200 host
(tests/data/gpu/h200), and which GPUs CUDA shows under CUDA_VISIBLE_DEVICES.

Copies of the tree are edited only to make the input a test needs (a second GPU, a
two-node host, a device the firmware placed): each edit is named where it is made.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pycxl.base.sysfs import Sysfs
from pycxl.gpu import read_gpus
from pycxl.gpu.nearest import nearest_node
from pycxl.gpu.procfs import GPUS_DIR, information, read_inventory
from pycxl.gpu.visible import Undecided, select_visible

H200 = Path(__file__).parents[1] / "data" / "gpu" / "h200"
BUS = "0000:00:06.0"
UUID = "GPU-68485e76-1095-d792-0ba6-e4b77e272a68"
SECOND = "0000:00:07.0"
SECOND_UUID = "GPU-11111111-2222-3333-4444-555555555555"
DOCS = Path(__file__).parents[2] / "docs" / "cli.md"


def run_list(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pycxl.cli.main", "list", *args],
                          capture_output=True, text=True, check=False)  # fmt: skip


@pytest.fixture
def two_gpus(tmp_path: Path) -> Path:
    """The H200 tree with a second GPU: its information file copied to bus 00:07.0 with
    another UUID and bus location."""
    root = tmp_path / "two"
    shutil.copytree(H200, root)
    src = root / GPUS_DIR.lstrip("/") / BUS
    dst = root / GPUS_DIR.lstrip("/") / SECOND
    dst.mkdir()
    text = (src / "information").read_text()
    (dst / "information").write_text(text.replace(UUID, SECOND_UUID).replace(BUS, SECOND))
    return root


def _set_model(root: Path, bus: str, model: str) -> None:
    f = root / GPUS_DIR.lstrip("/") / bus / "information"
    f.write_text(re.sub(r"^Model:.*$", f"Model: \t\t {model}", f.read_text(), flags=re.M))


def test_information_file_as_the_driver_writes_it() -> None:
    info = information(Sysfs(H200), BUS)
    assert info["Model"] == "NVIDIA H200" and info["GPU UUID"] == UUID
    assert info["Bus Location"] == BUS and info["GPU Excluded"] == "No"
    assert info["Device Minor"] == "0" and info["Bus Type"] == "PCIe"


def test_recorded_tree_gives_the_driver_files_facts_and_no_more() -> None:
    inv = read_gpus(Sysfs(H200))
    (g,) = inv.devices
    assert inv.absent_reason is None
    assert (g.target_name, g.ordinal, g.name, g.uuid, g.pci_bus_id, g.source) == (
        "gpu0", 0, "NVIDIA H200", UUID, BUS, "procfs")  # fmt: skip
    # numa_node is -1 there and node 0 holds every CPU: the only node with CPUs
    assert (g.numa_node, g.numa_node_source) == (0, "only-cpu-node")
    # what the files do not say stays unknown
    assert g.total_memory is None and g.sm_count is None and g.compute_capability is None
    assert g.l2_cache is None and g.sm_count_source is None


def test_nearest_node_sources(tmp_path: Path) -> None:
    root = tmp_path / "t"
    shutil.copytree(H200, root)
    fs = Sysfs(root)
    asked: list[int] = []

    def driver_says(node: int | None) -> Callable[[], int | None]:
        def ask() -> int | None:
            asked.append(1)
            return node

        return ask

    # the recorded VM: numa_node -1, one node with CPUs; the driver is not asked
    assert nearest_node(fs, BUS, driver_says(3)) == (0, "only-cpu-node") and not asked
    assert nearest_node(fs, BUS) == (0, "only-cpu-node")
    # edited: a host with CPUs in two nodes, the device still placed in none
    (root / "sys/devices/system/node/has_cpu").write_text("0-1\n")
    assert nearest_node(fs, BUS, driver_says(1)) == (1, "driver") and asked == [1]
    assert nearest_node(fs, BUS, driver_says(-1)) == (None, "none")
    assert nearest_node(fs, BUS) == (None, "none")
    # edited: firmware that places the device in node 1; the kernel's word comes first
    (root / f"sys/bus/pci/devices/{BUS}/numa_node").write_text("1\n")
    asked.clear()
    assert nearest_node(fs, BUS, driver_says(0)) == (1, "sysfs") and not asked


def test_list_json_of_the_recorded_tree_has_every_documented_field() -> None:
    p = run_list("-G", "--json", "--sysroot", str(H200))
    assert p.returncode == 0, p.stderr
    (doc,) = json.loads(p.stdout)
    row = next(line for line in DOCS.read_text().splitlines() if line.startswith("| GPU |"))
    documented = re.findall(r"`([a-z_0-9]+)`", row)
    assert list(doc) == documented
    assert doc["numa_node"] == 0 and doc["numa_node_source"] == "only-cpu-node"
    assert doc["source"] == "procfs" and doc["total_memory"] is None
    assert doc["compute_capability"] is None and doc["pci_bus_id"] == BUS


def test_list_table_says_what_is_unknown() -> None:
    p = run_list("-G", "--sysroot", str(H200))
    assert p.returncode == 0, p.stderr
    (line,) = [x for x in p.stdout.splitlines() if x.startswith("gpu0")]
    assert line.split() == ["gpu0", "NVIDIA", "H200", BUS, "-", "-", "-", "0", "(only-cpu-node)",
                            "32GT/s", "x16"]  # fmt: skip


def test_excluded_gpu_is_not_listed(tmp_path: Path) -> None:
    root = tmp_path / "x"
    shutil.copytree(H200, root)
    f = root / GPUS_DIR.lstrip("/") / BUS / "information"
    f.write_text(f.read_text().replace("GPU Excluded:\t No", "GPU Excluded:\t Yes"))  # edited
    inv = read_gpus(Sysfs(root))
    assert inv.devices == () and inv.absent_reason == "no NVIDIA GPU driver"


def test_check_names_the_gpu_of_a_recorded_tree() -> None:
    p = subprocess.run([sys.executable, "-m", "pycxl.cli.main", "check", "--json", "--sysroot",
                        str(H200)], capture_output=True, text=True, check=False)  # fmt: skip
    links = [f for f in json.loads(p.stdout)["findings"] if f["check"] == "pcie-link"]
    assert [(f["subject"], f["labels"]["device"]) for f in links] == [("gpu0", BUS)]


def _visible(root: Path, env: dict[str, str]) -> list[tuple[str, str, int | None]]:
    inv = read_inventory(Sysfs(root), env)
    assert inv is not None
    return [(g.target_name, g.pci_bus_id, g.ordinal) for g in inv.devices]


def test_cuda_visible_devices(two_gpus: Path) -> None:
    assert _visible(two_gpus, {}) == [("gpu0", BUS, 0), ("gpu1", SECOND, 1)]
    assert _visible(two_gpus, {"CUDA_VISIBLE_DEVICES": "1"}) == [("gpu0", SECOND, 0)]
    # CUDA numbers them in the order named; pycxl's names stay in bus order
    assert _visible(two_gpus, {"CUDA_VISIBLE_DEVICES": f"{SECOND_UUID[:12]},0"}) == [
        ("gpu0", BUS, 1), ("gpu1", SECOND, 0)]  # fmt: skip
    assert _visible(two_gpus, {"CUDA_VISIBLE_DEVICES": " 0 , 1 "}) == [
        ("gpu0", BUS, 0), ("gpu1", SECOND, 1)]  # fmt: skip
    inv = read_inventory(Sysfs(two_gpus), {"CUDA_VISIBLE_DEVICES": ""})
    assert inv is not None and inv.devices == ()
    assert inv.absent_reason == "CUDA_VISIBLE_DEVICES hides every GPU"


@pytest.mark.parametrize(
    ("spec", "why"),
    [("2", "names GPU 2, which does not exist"), ("0,0", "names '0' twice"),
     ("MIG-1234", "'MIG-1234' names no single GPU"), ("GPU-", "'GPU-' names no single GPU"),
     ("-1", "'-1' names no single GPU")],
)  # fmt: skip
def test_cuda_visible_devices_only_cuda_can_settle(two_gpus: Path, spec: str, why: str) -> None:
    with pytest.raises(Undecided, match=re.escape(why)):
        read_inventory(Sysfs(two_gpus), {"CUDA_VISIBLE_DEVICES": spec})


def test_mixed_models_keep_cuda_order_unknown(two_gpus: Path) -> None:
    _set_model(two_gpus, SECOND, "NVIDIA A100-SXM4-80GB")  # edited: another model
    # which GPUs are shown is known; CUDA's fastest-first numbering is not
    assert _visible(two_gpus, {}) == [("gpu0", BUS, None), ("gpu1", SECOND, None)]
    assert _visible(two_gpus, {"CUDA_VISIBLE_DEVICES": SECOND_UUID}) == [("gpu0", SECOND, 0)]
    with pytest.raises(Undecided, match="fastest first"):
        read_inventory(Sysfs(two_gpus), {"CUDA_VISIBLE_DEVICES": "1"})
    pci = {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert _visible(two_gpus, pci) == [("gpu0", SECOND, 0)]


def test_select_visible_keeps_the_facts(two_gpus: Path) -> None:
    found = read_inventory(Sysfs(two_gpus), {})
    assert found is not None
    (g,) = select_visible(found.devices, {"CUDA_VISIBLE_DEVICES": "1"})
    assert (g.uuid, g.name, g.numa_node, g.numa_node_source) == (
        SECOND_UUID, "NVIDIA H200", 0, "only-cpu-node")  # fmt: skip


@pytest.mark.parametrize("name", ["nvml", "cuda"])
def test_declarations_parsed_at_install_match_the_headers(name: str, tmp_path: Path) -> None:
    """pycxl._abi_<name> is native/<name>.h as cffi parses it (stale after an edit of the
    header until pycxl is installed again)."""
    from cffi import recompiler

    from pycxl.base._lib.loader import parsed_declarations

    try:
        built = importlib.import_module(f"pycxl._abi_{name}")
    except ImportError:
        pytest.skip(f"pycxl._abi_{name} was not built here (a source tree, not installed)")
    fresh = tmp_path / f"_abi_{name}.py"
    recompiler.make_py_source(parsed_declarations(name), f"pycxl._abi_{name}", str(fresh))
    assert Path(str(built.__file__)).read_text() == fresh.read_text(), (
        f"pycxl._abi_{name} is stale: reinstall pycxl (pip install .)"
    )


NVML_START = """
import sys
from pycxl.base._lib.libs import LIBNVML
from pycxl.gpu import nvml_session as s
if sys.argv[1] == "broken":  # a bug in the start itself, on the starting thread
    def load():
        raise RuntimeError("declarations do not match the library")
    LIBNVML.load = load
s.begin()
s.begin()  # a second call starts nothing more
for _ in range(2):  # the outcome is decided once and said to every caller
    try:
        with s.session():
            print("started")
    except s.NvmlUnusable as e:
        print("unusable:", e)
    except RuntimeError as e:
        print("raised:", e)
import threading
print(sorted(t.name for t in threading.enumerate() if t.name.startswith("pycxl")))
"""


@pytest.mark.parametrize("case", ["absent", "broken"])
def test_nvml_started_on_a_thread_reports_to_the_caller_that_waits(case: str) -> None:
    """begin() starts NVML on a thread; session() waits for it and says what happened:
    the library missing (this machine) in NVML's words, a bug as the bug."""
    from pycxl.base._lib.libs import LIBNVML

    if case == "absent" and LIBNVML.available():
        pytest.skip("NVML is installed here")
    p = subprocess.run([sys.executable, "-c", NVML_START, case], capture_output=True,
                       text=True, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    want = ("unusable: libnvidia-ml.so.1 not found" if case == "absent"
            else "raised: declarations do not match the library")  # fmt: skip
    assert p.stdout.splitlines() == [want, want, "[]"], p.stdout


# A stand-in for libnvidia-ml where the real one cannot run (no NVIDIA driver here):
# NVML's own declarations, and a driver that is not loaded at the first call.
FAKE_NVML = """
import os, sys, time
from pycxl.base._lib.libs import LIBNVML
from pycxl.base._lib.loader import parsed_declarations
from pycxl.gpu import nvml_session as s
ffi = parsed_declarations("nvml")
class Driver:
    starts = 0
    def nvmlInit_v2(self):
        Driver.starts += 1
        return 9 if Driver.starts == 1 else 0  # NVML_ERROR_DRIVER_NOT_LOADED, then up
    def nvmlErrorString(self, rc):
        self.text = ffi.new("char[]", b"Driver Not Loaded")
        return self.text
    def nvmlDeviceGetCount_v2(self, count):
        count[0] = 0
        return 0
def load():
    time.sleep(0.3)  # the start is still on its thread when the test acts
    return ffi, Driver()
LIBNVML.load = load
def ask(who):
    try:
        with s.session():
            print(who, "started")
    except s.NvmlUnusable as e:
        print(who, "unusable:", e)
s.begin()
if sys.argv[1] == "fork":
    Driver.starts = 1  # the driver is up: what the child is told is its own start
    pid = os.fork()
    if pid == 0:
        ask("child")
        os._exit(0)
    os.waitpid(pid, 0)
    ask("parent")
else:
    ask("first")
    ask("second")
"""


@pytest.mark.parametrize("case", ["retry", "fork"])
def test_a_failed_or_forked_nvml_start_is_tried_again(case: str) -> None:
    """A start that failed is reported once and tried again by the next caller (a driver
    can come up after a first call); a child forked while the start was on its thread
    starts NVML itself instead of reading a dead thread's silence."""
    p = subprocess.run([sys.executable, "-c", FAKE_NVML, case], capture_output=True,
                       text=True, check=False, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    want = (["first unusable: NVML: Driver Not Loaded", "second started"] if case == "retry"
            else ["child started", "parent started"])  # fmt: skip
    assert p.stdout.splitlines() == want, p.stdout + p.stderr
