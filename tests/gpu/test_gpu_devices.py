"""GPU enumeration against nvidia-smi, on a machine with a CUDA driver."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from pycxl.gpu import read_gpus

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


def test_gpus_match_nvidia_smi() -> None:
    inv = read_gpus()
    smi = {g["uuid"]: g for g in _smi()}
    assert inv.absent_reason is None and len(inv.devices) == len(smi) > 0
    for g in inv.devices:
        ref = smi[g.uuid]
        assert g.name == ref["name"]
        assert g.pci_bus_id == ref["pci.bus_id"].lower()[-12:]
        # cuDeviceTotalMem excludes memory the driver reserves; nvidia-smi counts the
        # whole framebuffer (H200: 143157 vs 143771 MiB). Allow that reserve, no more.
        smi_bytes = int(ref["memory.total"]) << 20
        assert 0.98 * smi_bytes <= g.total_memory <= smi_bytes
        assert g.sm_count > 0 and g.compute_capability[0] >= 5
        assert g.numa_node is not None and g.numa_node_source in ("driver", "sysfs")
    assert [g.pci_bus_id for g in inv.devices] == sorted(g.pci_bus_id for g in inv.devices)


def test_cli_lists_gpus() -> None:
    p = subprocess.run([sys.executable, "-m", "pycxl.cli.main", "list", "-G", "--json"],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc[0]["gpu"] == "gpu0" and doc[0]["total_memory"] > 0
