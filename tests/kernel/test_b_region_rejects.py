"""Every rejection of `pycxl region create` on the real kernel: a clear error, the
documented exit code, and the CXL state unchanged. Runs on the fresh topology."""

from __future__ import annotations

import os

import pytest

from pycxl.base.errors import NeedsRootError
from pycxl.cxl import regions
from pycxl.cxl.region_layout import RegionRequest
from tests.kernel.kernel_helpers import cxl_state, pycxl_cli, state_diff

REJECTIONS = [
    (["-w", "5"], 2, "interleave ways 5 is not one CXL supports"),
    (["-w", "2", "-g", "3000"], 2, "granularity 3000 is not a power of two"),
    (["-w", "2", "-s", "256M"], 2, "not a multiple of 256 MiB x 2 ways"),
    (["-w", "2", "-s", "1G"], 2, "mem0 (256.00 MiB free)"),
    (["0x1"], 0, None),  # a 1-way region is legal: checked below with --dry-run only
    (["0x1", "-w", "2"], 2, "1 memdev(s) named for a 2-way region"),
    (["0x1", "0x1"], 2, "named twice"),
    (["0x1", "0x9"], 5, "unknown memdev '0x9'"),
    (["-w", "2", "-t", "pmem"], 2, "0 B free"),
    (["-w", "2", "-d", "decoder9.9"], 5, "unknown root decoder 'decoder9.9'"),
    (["-w", "2", "-d", "decoder1.0"], 2, "not a root decoder"),
    (["-w", "2", "-U", "x"], 2, "--uuid applies to pmem regions only"),
]


@pytest.mark.kernel(topology="two-dev")
def test_rejections_change_nothing() -> None:
    before = cxl_state()
    for args, code, message in REJECTIONS:
        if message is None:
            p = pycxl_cli("region", "create", *args, "--dry-run")
            assert p.returncode == 0 and "1-way" in p.stdout, p.stdout + p.stderr
            continue
        p = pycxl_cli("region", "create", *args)
        assert p.returncode == code, (args, p.stdout, p.stderr)
        assert message in p.stderr, (args, p.stderr)
        assert "Traceback" not in p.stderr
    for args, code, message in (
        (["destroy", "region9"], 5, "unknown region 'region9'; there is no region"),
        (["enable", "region9"], 5, "unknown region 'region9'"),
        (["disable", "region9"], 5, "unknown region 'region9'"),
    ):
        p = pycxl_cli("region", *args)
        assert (p.returncode, message in p.stderr) == (code, True), p.stderr
    assert state_diff(before, cxl_state()) == []


@pytest.mark.kernel(topology="two-dev")
def test_not_root_is_refused_before_any_write() -> None:
    before = cxl_state()
    pid = os.fork()
    if pid == 0:  # child: drop to 'nobody', then ask for a region
        code = 1
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            regions.create_region(RegionRequest(ways=2))
        except NeedsRootError as e:
            code = 3 if "run it as root" in str(e) else 4
        except BaseException as e:
            os.write(2, f"child: {e!r}\n".encode())
            code = 5
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3
    assert state_diff(before, cxl_state()) == []
