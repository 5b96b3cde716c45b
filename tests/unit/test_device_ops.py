"""CXL device operations on recorded trees: every refusal comes before any write, with
one line naming the problem and the fix, and every plan shows the writes it would make.
What the kernel then does with them is proven in tests/kernel/test_l_device_ops.py."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError, NotAvailableError, NotFoundError
from pycxl.cxl.alerts import AlertChange, alert_change, alert_payload
from pycxl.cxl.firmware import check_image
from pycxl.cxl.partition import Partitioning, volatile_size
from tests.unit.test_refusals import one_error_line, pycxl_cli

ROOT = Path(__file__).resolve().parents[2]
TREES = ROOT / "tests" / "data" / "trees"
PMEM = str(TREES / "pmem-dev" / "fresh")
REGION = str(TREES / "two-dev" / "region")


def _tree(path: str) -> pycxl.System:
    """A recorded tree as the host an operation is handed (``system=``)."""
    return pycxl.snapshot(path, gpus=False)


MiB = 1 << 20


def _digest(tree: str) -> str:
    """Every file of a tree, hashed: a refusal changes none of them."""
    h = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(tree)):
        for f in sorted(files):
            p = os.path.join(dirpath, f)
            if os.path.isfile(p) and not os.path.islink(p):
                h.update(p.encode())
                with open(p, "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["memdev", "read-labels", "mem0", "-O", "1M"], 2, "beyond mem0's label area of 1048576"),
        (["memdev", "read-labels", "mem0", "-s", "2M"], 2, "give at most 1048576"),
        (["memdev", "zero-labels", "mem0", "-O", "1020K", "-s", "8K"], 2, "give at most 4096"),
        (["memdev", "reserve-dpa", "mem0", "-s", "100M"], 2, "multiple of 256M"),
        (["memdev", "reserve-dpa", "mem0", "-s", "512M"], 2, "exceeds mem0's free ram"),
        (["memdev", "reserve-dpa", "mem0", "-d", "2"], 2, "out of sequence"),
        (["memdev", "reserve-dpa", "mem0", "-d", "decoder9.9"], 5, "not one of mem0's"),
        (["memdev", "free-dpa", "mem0"], 2, "no DPA is reserved on it: there is nothing to free"),
        (["memdev", "inject-media-poison", "mem0", "-a", "0x1001"], 2, "not 64-byte aligned"),
        (["memdev", "inject-media-poison", "mem0", "-a", "0x20000000"], 2, "beyond mem0's"),
        (["memdev", "inject-media-poison", "mem0", "-a", "lots"], 2, "'lots' is not a number"),
        (["memdev", "inject-media-poison", "mem0", "-a", "0x1000"], 4, "mount debugfs"),
        (["memdev", "sanitize", "mem0"], 2, "pass --force"),
        (["memdev", "set-alert-config", "mem0", "-L", "80"], 2, "needs --life-used-alert on"),
        (["memdev", "set-alert-config", "mem0", "--life-used-alert", "on"], 2, "needs --life"),
        (["memdev", "set-alert-config", "mem0", "--life-used-alert", "on", "-L", "101"], 2,
         "from 0 to 100"),
        (["memdev", "set-alert-config", "mem0", "--pmem-err-alert", "off", "-P", "3"], 2,
         "takes no threshold"),
        (["memdev", "set-alert-config", "mem0"], 2, "no alert named"),
        (["memdev", "update-firmware", "mem0"], 2, "--firmware-file"),
        (["memdev", "disable", "mem7"], 5, "unknown memdev 'mem7'"),
        (["port", "disable", "root0"], 2, "disable it as a bus (pycxl bus disable root0)"),
        (["port", "disable", "port9"], 5, "known: port1"),
        (["port", "inject-protocol-error", "0000:0c:00.0", "-t", "mem-fatal"], 4,
         "no ACPI EINJ table"),
        (["port", "inject-protocol-error", "0000:99:00.0", "-t", "mem-fatal"], 5, "unknown dport"),
        (["bus", "disable", "root7"], 5, "unknown bus 'root7'"),
    ],
)  # fmt: skip
def test_refusals_name_the_problem_and_change_nothing(args: list[str], code: int,
                                                      words: str) -> None:  # fmt: skip
    before = _digest(PMEM)
    one_error_line(pycxl_cli(*args, "--sysroot", PMEM), code, words)
    assert _digest(PMEM) == before


def test_an_active_region_is_not_taken_away_without_force() -> None:
    before = _digest(REGION)
    for args in (["memdev", "disable", "0x1"], ["port", "disable", "port1"],
                 ["bus", "disable", "root0"], ["memdev", "sanitize", "mem0"]):  # fmt: skip
        one_error_line(pycxl_cli(*args, "--sysroot", REGION), 2, "region0")
    p = pycxl_cli("memdev", "disable", "0x1", "--force", "--dry-run", "--sysroot", REGION)
    assert p.returncode == 0, p.stderr
    assert "forced: disabling mem" in p.stderr and "region0" in p.stderr
    assert "unbind" in p.stdout
    assert _digest(REGION) == before


def test_dry_runs_show_the_writes_each_operation_makes() -> None:
    r = pycxl.reserve_dpa("mem0", size=256 * MiB, mode="pmem", system=_tree(PMEM), dry_run=True)
    assert not r.executed
    writes = [(s.path, s.value) for s in r.plan]
    assert writes == [
        ("/sys/bus/cxl/devices/decoder2.0/mode", "pmem"),
        ("/sys/bus/cxl/devices/decoder2.0/dpa_size", str(256 * MiB)),
    ]
    assert r.plan.steps[1].undo_writes == (("/sys/bus/cxl/devices/decoder2.0/dpa_size", "0"),)
    d = pycxl.disable_memdev("0x52", system=_tree(PMEM), dry_run=True)
    assert [(s.path, s.value) for s in d.plan] == [("/sys/bus/cxl/drivers/cxl_mem/unbind",
                                                    "mem1")]  # fmt: skip
    assert d.plan.steps[0].undo_writes == (("/sys/bus/cxl/drivers/cxl_mem/bind", "mem1"),)
    e = pycxl.enable_memdev("mem1", system=_tree(PMEM), dry_run=True)
    assert len(e.plan) == 0  # enabled already: nothing to do
    p = pycxl.disable_port("port1", system=_tree(PMEM), dry_run=True)
    assert p.details["memdevs"] == ["mem0", "mem1"]
    assert [(s.path, s.value) for s in p.plan] == [  # the memdevs below first, as ndctl asks
        ("/sys/bus/cxl/drivers/cxl_mem/unbind", "mem0"),
        ("/sys/bus/cxl/drivers/cxl_mem/unbind", "mem1"),
        ("/sys/bus/cxl/drivers/cxl_port/unbind", "port1"),
    ]
    ep = pycxl.enable_port("port1", enable_memdevs=True, system=_tree(PMEM), dry_run=True)
    assert len(ep.plan) == 0  # bound already, memdevs too
    b = pycxl.disable_bus("ACPI.CXL", system=_tree(PMEM), dry_run=True)
    assert [(s.path, s.value) for s in b.plan] == [
        ("/sys/bus/platform/drivers/cxl_acpi/unbind", "ACPI0017:00")
    ]
    z = pycxl.zero_labels("mem0", size=4096, offset=8192, system=_tree(PMEM), dry_run=True)
    assert z.details == {"offset": 8192, "size": 4096}
    assert "3 Set LSA commands" in z.plan.steps[0].description  # 2040-byte pieces
    s = pycxl.sanitize("mem0", force=True, system=_tree(PMEM), dry_run=True)
    assert [(x.path, x.value) for x in s.plan] == [
        ("/sys/bus/cxl/devices/mem0/security/sanitize", "1")
    ]


def test_memdevs_without_a_label_area_or_firmware_loader_say_so() -> None:
    with pytest.raises(NotAvailableError, match="no label storage area"):
        pycxl.read_labels("mem0", system=_tree(REGION))
    with pytest.raises(NotFoundError):
        pycxl.zero_labels("mem9", system=_tree(PMEM))


def test_alert_requests_are_checked_as_ndctl_checks_them() -> None:
    assert alert_change("life_used", None, None) is None
    assert alert_change("life_used", "on", 80) == AlertChange("life_used", True, 80)
    assert alert_change("over_temperature", "on", -5) == AlertChange("over_temperature", True, -5)
    assert alert_change("pmem_err", "off", None) == AlertChange("pmem_err", False)
    with pytest.raises(InvalidRequestError, match="from 0 to 65535"):
        alert_change("volatile_mem_err", "on", 70000)
    with pytest.raises(InvalidRequestError, match="use on or off"):
        alert_change("life_used", "maybe", None)
    # the payload (CXL 3.1 Set Alert Configuration): valid and enable bits, thresholds
    payload = alert_payload([AlertChange("life_used", True, 80),
                             AlertChange("under_temperature", True, -10),
                             AlertChange("pmem_err", False)])  # fmt: skip
    assert len(payload) == 12
    assert struct.unpack("<BBBBhhHH", payload) == (0x15, 0x05, 80, 0, 0, -10, 0, 0)


def test_firmware_images_are_checked_before_a_transfer(tmp_path: Path) -> None:
    good, odd, empty = tmp_path / "good.bin", tmp_path / "odd.bin", tmp_path / "empty.bin"
    good.write_bytes(bytes(4096))
    odd.write_bytes(bytes(1000))
    empty.write_bytes(b"")
    assert check_image(str(good)) == 4096
    with pytest.raises(InvalidRequestError, match="not a whole number of 128-byte units"):
        check_image(str(odd))
    with pytest.raises(InvalidRequestError, match="is empty"):
        check_image(str(empty))
    with pytest.raises(InvalidRequestError, match="no such file"):
        check_image(str(tmp_path / "none.bin"))
    with pytest.raises(NotAvailableError, match="no /sys/class/firmware/mem0"):
        pycxl.update_firmware("mem0", str(good), system=_tree(REGION), dry_run=True)


def test_partition_sizes_follow_ndctl() -> None:
    p = Partitioning(total=1024 * MiB, volatile_only=256 * MiB, persistent_only=0,
                     alignment=256 * MiB)  # fmt: skip
    assert volatile_size("mem0", p, "pmem", None, False) == 0  # all of it persistent
    assert volatile_size("mem0", p, "ram", None, False) == 768 * MiB
    assert volatile_size("mem0", p, "pmem", 256 * MiB, False) == 512 * MiB
    with pytest.raises(InvalidRequestError, match="pass --align"):
        volatile_size("mem0", p, "ram", 300 * MiB, False)
    assert volatile_size("mem0", p, "ram", 300 * MiB, True) == 512 * MiB
    assert volatile_size("mem0", p, "pmem", 300 * MiB, True) == 256 * MiB
    with pytest.raises(InvalidRequestError, match="exceeds the 768 MiB"):
        volatile_size("mem0", p, "ram", 1024 * MiB, False)
    fixed = Partitioning(total=512 * MiB, volatile_only=256 * MiB, persistent_only=256 * MiB,
                         alignment=0)  # fmt: skip
    with pytest.raises(InvalidRequestError, match="no capacity that can change partition"):
        volatile_size("mem0", fixed, "ram", None, False)


def test_check_reports_what_operations_left_running(tmp_path: Path) -> None:
    import json
    import shutil

    from pycxl.cxl.health import AlertConfig
    from pycxl.ops.check_devices import alert_finding

    tree = tmp_path / "tree"
    shutil.copytree(PMEM, tree, symlinks=True)
    # edited to show a sanitize under way on mem0 (only the file's content changes; the
    # recorder does not keep /sys/class/firmware, so the firmware loader's state is
    # shown by the kernel tests)
    base = tree / "sys" / "devices" / "pci0000:0c" / "0000:0c:00.0" / "0000:0d:00.0" / "mem0"
    (base / "security" / "state").write_text("sanitize\n")
    p = pycxl_cli("check", "--events", "", "--json", "--sysroot", str(tree))
    assert p.returncode == 6, p.stderr
    found = {(f["check"], f["subject"]): f for f in json.loads(p.stdout)["findings"]}
    assert "being sanitized" in found["sanitize", "mem0"]["message"]
    assert found["sanitize", "mem0"]["fix"] == "pycxl memdev wait-sanitize mem0"
    assert ("sanitize", "mem1") not in found
    # thresholds someone set are reported as such (QEMU's device has no Get Alert
    # Configuration, so the kernel tests cannot show it)
    cfg = AlertConfig(valid=0x11, programmable=0x1F, life_used_crit=90, life_used_warn=80,
                      over_temp_crit=0, under_temp_crit=0, over_temp_warn=0, under_temp_warn=0,
                      volatile_err_warn=0, pmem_err_warn=7)  # fmt: skip
    f = alert_finding("mem0", cfg, {})
    assert f is not None and f.message == "mem0: warning alerts set: life used at 80, pmem err at 7"
    assert alert_finding("mem0", AlertConfig(0, 0x1F, 0, 0, 0, 0, 0, 0, 0, 0), {}) is None
