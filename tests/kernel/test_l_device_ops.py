"""Every device operation of ndctl's ``cxl`` v85, proven on the real kernel (pmem-dev:
two devices with volatile and persistent capacity and a label area each). Where
Debian's ndctl 76.1 has the command, its view (``cxl read-labels``, ``cxl list``) is
the oracle; where it has not, the kernel's own state is (sysfs, debugfs, the poison list
through trace events, the device's firmware slots from the mailbox). What QEMU's device
cannot do (Get/Set Alert Configuration, Set Partition Info, EINJ) is refused before any
change, naming why. Memdevs are picked by serial: their numbers follow probe order.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable

import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError, NotAvailableError
from pycxl.base.sysfs import Sysfs
from pycxl.base.waiting import wait_until
from pycxl.cxl import firmware
from pycxl.cxl.health import read_health
from pycxl.cxl.mailbox import SET_PARTITION_INFO, Mailbox, Unsupported
from pycxl.cxl.poison import read_poison
from pycxl.cxl.read import security_state
from pycxl.cxl.region_layout import RegionRequest
from pycxl.cxl.sysfs_backend import read_topology
from pycxl.ops.check import run_check
from pycxl.resolve.system import snapshot
from tests.kernel.kernel_helpers import ndctl, pycxl_cli

PMEM = pytest.mark.kernel(topology="pmem-dev")
MiB = 1 << 20
FIRST, SECOND = "0x51", "0x52"


def _name(serial: str) -> str:
    return read_topology().find_memdev(serial).name


def _debugfs() -> None:
    """The kernel's poison injection lives in debugfs (as ndctl's does)."""
    if not os.path.exists("/sys/kernel/debug/cxl"):
        subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"], check=True)


def _cxl_read_labels(memdev: str, size: int, offset: int) -> bytes:
    with tempfile.NamedTemporaryFile() as f:
        subprocess.run(["cxl", "read-labels", memdev, "-s", str(size), "-O", str(offset), "-o",
                        f.name], check=True, capture_output=True)  # fmt: skip
        return f.read()


def _ndctl_state(memdev: str) -> str:
    (doc,) = ndctl("-M", "-i", "-m", memdev)
    return str(doc.get("state", "enabled"))


@PMEM
def test_labels_written_read_back_and_zeroed_as_cxl_read_labels_sees_them() -> None:
    mem = _name(FIRST)
    data = os.urandom(5000)  # three Set LSA pieces of 2040 bytes at most
    # while its nvdimm (cxl_pmem) holds the label area, the kernel keeps Set LSA to
    # itself: refused before anything is read or written, with the way out
    with pytest.raises(InvalidRequestError, match=f"pycxl memdev disable {mem}"):
        pycxl.write_labels(mem, data, offset=8192)
    before = _cxl_read_labels(mem, 5000, 8192)

    off = pycxl.disable_memdev(mem)
    assert off.executed and off.memdev is not None and not off.memdev.enabled
    assert _ndctl_state(mem) == "disabled"
    try:
        w = pycxl.write_labels(mem, data, offset=8192)
        assert w.executed and w.details == {"offset": 8192, "size": 5000}
        assert pycxl.read_labels(mem, size=5000, offset=8192) == data
        assert _cxl_read_labels(mem, 5000, 8192) == data  # the oracle, byte for byte
        p = subprocess.run([*_cli(), "memdev", "read-labels", FIRST, "-s", "5000", "-O", "8192"],
                           capture_output=True, check=False)  # fmt: skip
        assert p.returncode == 0 and p.stdout == data, p.stderr
        z = pycxl.zero_labels(mem, size=5000, offset=8192)
        assert z.executed
        assert pycxl.read_labels(mem, size=5000, offset=8192) == bytes(5000)
        assert _cxl_read_labels(mem, 5000, 8192) == bytes(5000)
        assert before == bytes(5000)  # a fresh label area: zeroing put it back as it was
        # outside the area: refused before the mailbox
        with pytest.raises(InvalidRequestError, match="give at most 4096"):
            pycxl.read_labels(mem, size=8192, offset=(1 << 20) - 4096)
    finally:
        on = pycxl.enable_memdev(mem)
    assert on.memdev is not None and on.memdev.enabled and _ndctl_state(mem) == "enabled"
    assert read_topology().memdev(mem).endpoint is not None


def _cli() -> list[str]:
    import sys

    return [sys.executable, "-m", "pycxl.cli.main"]


@PMEM
def test_a_memdev_in_an_active_region_stays_until_forced_or_its_region_goes() -> None:
    mem = _name(SECOND)
    made = pycxl.create_region(RegionRequest(memdevs=(SECOND,), ways=1, type="ram",
                                             online=False))  # fmt: skip
    region = made.name
    refusals: list[Callable[[], object]] = [
        lambda: pycxl.disable_memdev(mem), lambda: pycxl.disable_port("port1"),
        lambda: pycxl.disable_bus("root0"), lambda: pycxl.sanitize(mem, force=True),
    ]  # fmt: skip
    for refused in refusals:
        with pytest.raises(InvalidRequestError, match=region):
            refused()
    assert read_topology().memdev(mem).enabled and read_topology().region(region).committed
    p = pycxl_cli("memdev", "disable", SECOND, "--force", "--dry-run")
    assert p.returncode == 0 and "forced" in p.stderr and region in p.stderr, p.stderr
    assert "/sys/bus/cxl/drivers/cxl_mem/unbind <- " in p.stdout
    pycxl.destroy_region(region)
    r = pycxl.disable_memdev(mem)
    assert r.memdev is not None and not r.memdev.enabled and _ndctl_state(mem) == "disabled"
    assert pycxl.disable_memdev(mem).plan.steps == ()  # disabled already: nothing to do
    r = pycxl.enable_memdev(mem)
    assert r.memdev is not None and r.memdev.enabled and _ndctl_state(mem) == "enabled"


def _ndctl_decoder(memdev: str, decoder: str) -> dict[str, object]:
    found = [d for d in ndctl("-D", "-i", "-d", decoder) if d.get("decoder") == decoder]
    assert len(found) == 1, found
    return dict(found[0])


@PMEM
def test_dpa_reserved_and_freed_as_cxl_list_shows() -> None:
    mem = _name(FIRST)
    with pytest.raises(InvalidRequestError, match="exceeds"):
        pycxl.reserve_dpa(mem, size=512 * MiB, mode="pmem")
    r = pycxl.reserve_dpa(mem, mode="pmem")  # all that is free: 256 MiB
    dec = r.details["decoder"]
    assert (dec.mode, dec.dpa_size) == ("pmem", 256 * MiB)
    assert dec.name.endswith(".0") and dec.dpa_resource == 256 * MiB  # after the ram part
    theirs = _ndctl_decoder(mem, dec.name)
    assert theirs["mode"] == "pmem" and theirs["dpa_size"] == 256 * MiB, theirs
    with pytest.raises(InvalidRequestError, match="no pmem capacity left"):
        pycxl.reserve_dpa(mem, mode="pmem")
    f = pycxl.free_dpa(mem)
    assert f.details["decoder"].dpa_size == 0
    assert _ndctl_decoder(mem, dec.name).get("dpa_size", 0) == 0
    r = pycxl.reserve_dpa(mem, size=256 * MiB)  # ram, on the same decoder again
    assert (r.details["decoder"].mode, r.details["decoder"].dpa_size) == ("ram", 256 * MiB)
    assert _ndctl_decoder(mem, dec.name)["mode"] == "ram"
    pycxl.free_dpa(mem, mode="ram")
    assert read_topology().decoder(dec.name).dpa_size == 0


@PMEM
def test_poison_injected_listed_checked_and_cleared() -> None:
    _debugfs()
    mem = _name(FIRST)
    assert read_topology().memdev(mem).poison_injectable is True
    p = pycxl_cli("list", "-M", "-m", mem, "--json")
    (doc,) = json.loads(p.stdout)
    assert doc["poison_injectable"] is True
    r = pycxl.inject_poison(mem, 0x1000)
    assert r.executed and r.details["address"] == 0x1000
    (rec,) = read_poison([mem])[mem]  # type: ignore[misc]
    assert (rec.dpa, rec.length, rec.source) == (0x1000, 64, "Injected")
    p = pycxl_cli("list", "-L", "-m", mem, "--json")
    (doc,) = json.loads(p.stdout)
    assert [(e["offset"], e["length"], e["source"]) for e in doc["media_errors"]] == [
        (0x1000, 64, "Injected")
    ]
    report = run_check(snapshot(gpus=False), event_log="")
    said = [f for f in report.findings if f.check == "poison" and f.subject == mem]
    assert said and said[0].severity == "warning" and "injected" in said[0].message, said
    with pytest.raises(InvalidRequestError, match="not 64-byte aligned"):
        pycxl.clear_poison(mem, 0x1010)
    pycxl.clear_poison(mem, 0x1000)
    assert read_poison([mem])[mem] == []


@PMEM
def test_what_qemus_device_lacks_is_refused_before_any_change() -> None:
    mem = _name(FIRST)
    # QEMU 10.0's device has no Get/Set Alert Configuration in its command effects log
    change = [pycxl.AlertChange("life_used", True, 80)]
    with pytest.raises(NotAvailableError, match=r"Get Alert Configuration on .*does not support"):
        pycxl.set_alert_config(mem, change)
    assert isinstance(read_health(mem).alert_config, Unsupported)
    # Set Partition Info: Identify says all capacity is fixed (volatile-only 256 MiB,
    # persistent-only 256 MiB), and the device does not have the command either
    with pytest.raises(InvalidRequestError, match="no capacity that can change partition"):
        pycxl.set_partition(mem, mode="ram")
    with Mailbox(mem) as mbox:
        assert "does not support it" in (mbox.refusal(SET_PARTITION_INFO) or "")
    # protocol errors go through the platform's ACPI EINJ, which this guest has not
    with pytest.raises(NotAvailableError, match="no ACPI EINJ table"):
        pycxl.inject_protocol_error("0000:0c:00.0", "mem-correctable")


@PMEM
def test_firmware_transferred_and_activated() -> None:
    mem = _name(SECOND)
    fs = Sysfs()
    before = firmware.firmware_info(fs, mem)
    with tempfile.NamedTemporaryFile(suffix=".bin") as img:
        img.write(os.urandom(1000))
        img.flush()
        with pytest.raises(InvalidRequestError, match="128-byte units"):
            pycxl.update_firmware(mem, img.name)
        img.seek(0)
        img.truncate()
        img.write(os.urandom(4096))
        img.flush()
        r = pycxl.update_firmware(mem, img.name)  # started; pycxl check sees it running
        findings = run_check(snapshot(gpus=False), event_log="", device_health=False).findings
        running = firmware.loader_state(fs, mem)  # still busy after the check: busy during it
        said = [f for f in findings if f.check == "firmware" and f.subject == mem]
        if running.busy:
            assert said and "under way" in said[0].message, findings
        wait_until(lambda: True if not firmware.loader_state(fs, mem).busy else None,
                   what="the firmware update", timeout=300, live=False)  # fmt: skip
        print(f"loader right after the start: {running}")
        again = pycxl.update_firmware(mem, img.name, wait=True, timeout=300)
    assert r.executed and again.executed
    state = firmware.loader_state(fs, mem)
    assert not state.busy and not state.error, state
    after = firmware.firmware_info(fs, mem)
    # QEMU's device took the image into its second slot (seen: 'BWFW VERSION 1' beside
    # the running 'BWFW VERSION 0'), which Get FW Info now reports
    assert after != before, (before, after)
    assert after.slots == before.slots and after.revisions[0] == before.revisions[0]
    changed = [i + 1 for i, (a, b) in enumerate(zip(before.revisions, after.revisions,
                                                    strict=True)) if a != b]  # fmt: skip
    assert changed and all(after.revisions[i - 1] for i in changed), (before, after)


@PMEM
def test_sanitize_runs_to_completion_and_check_sees_it_running() -> None:
    mem = _name(SECOND)
    assert security_state(Sysfs(), mem) == "disabled"
    r = pycxl.sanitize(mem, force=True)
    running = security_state(Sysfs(), mem)
    findings = run_check(snapshot(gpus=False), event_log="", device_health=False).findings
    said = [f for f in findings if f.check == "sanitize" and f.subject == mem]
    if running == "sanitize":  # it may be over already: QEMU's is quick for 512 MiB
        assert said and "being sanitized" in said[0].message
    waited = pycxl.wait_sanitize(mem, timeout=300)
    print(f"sanitize state right after the start: {running}; waited {waited:.1f} s")
    assert r.executed and security_state(Sysfs(), mem) == "disabled"
    assert pycxl.wait_sanitize(mem) < 1.0  # none running: at once


@PMEM
def test_ports_disabled_and_enabled_as_cxl_list_shows() -> None:
    mems = sorted(m.name for m in read_topology().memdevs)
    r = pycxl.disable_port("port1")
    assert r.executed and r.details["memdevs"] == mems
    ports = {p["port"]: p for p in ndctl("-P", "-i")}
    assert ports["port1"].get("state") == "disabled", ports
    assert not read_topology().endpoints
    assert [_ndctl_state(m) for m in mems] == ["disabled", "disabled"]  # taken with it
    r = pycxl.enable_port("port1", enable_memdevs=True)
    assert r.executed
    try:
        wait_until(lambda: True if len(read_topology().endpoints) == 2 else None,
                   what="both endpoints back", timeout=60, live=False)  # fmt: skip
    except Exception:
        t = read_topology()
        print("plan:", *r.plan.show(), sep="\n")
        print("memdevs:", [(m.name, m.enabled) for m in t.memdevs])
        print("ports:", [(p.name, p.enabled) for p in t.all_ports])
        print(subprocess.run(["dmesg"], capture_output=True, text=True).stdout[-3000:])
        raise
    assert {p["port"]: p for p in ndctl("-P", "-i")}["port1"].get("state", "enabled") == ("enabled")
    ep = read_topology().memdev(mems[0]).endpoint
    assert ep is not None
    pycxl.disable_port(ep.name, endpoint=True)  # through its memdev: the endpoint goes
    assert ep.name not in {p["endpoint"] for p in ndctl("-E", "-i")}
    assert _ndctl_state(mems[0]) == "disabled"
    r = pycxl.enable_port(mems[0], endpoint=True)  # named by its memdev, once it is gone
    assert r.memdev is not None and r.memdev.enabled
    wait_until(lambda: True if len(read_topology().endpoints) == 2 else None,
               what="the endpoint back", timeout=60, live=False)  # fmt: skip
    assert len(ndctl("-E")) == 2


@PMEM
def test_regions_are_destroyed_newest_first_as_ndctl_v85_asks() -> None:
    ram = pycxl.create_region(RegionRequest(memdevs=(FIRST,), type="ram", online=False)).name
    pmem = pycxl.create_region(RegionRequest(memdevs=(FIRST,), type="pmem")).name
    with pytest.raises(InvalidRequestError, match=f"destroy {pmem} first"):
        pycxl.destroy_region(ram)
    assert read_topology().region(ram).committed  # refused before any write
    p = pycxl_cli("region", "destroy", "all", "--force")  # 'all' goes newest first
    assert p.returncode == 0, p.stderr
    assert not read_topology().regions


@PMEM
def test_the_bus_disabled_and_enabled_again() -> None:
    r = pycxl.disable_bus("root0")
    assert r.executed
    assert not os.path.exists("/sys/bus/cxl/devices/root0")
    assert ndctl("-B") == []
    pycxl.enable_bus()
    wait_until(lambda: True if len(read_topology().endpoints) == 2 else None,
               what="the bus and both endpoints back", timeout=120, live=False)  # fmt: skip
    assert [b["bus"] for b in ndctl("-B")] == ["root0"]
    time.sleep(1)
