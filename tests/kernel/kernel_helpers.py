"""Helpers for tests that run inside the testbed guest."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

from pycxl.cxl import libcxl_backend
from pycxl.cxl.topology import CxlTopology

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ndctl(*args: str) -> Any:
    """ndctl's own JSON (the oracle)."""
    out = subprocess.run(["cxl", "list", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout) if out.stdout.strip() else []


def pycxl_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pycxl.cli.main", *args], capture_output=True, text=True, check=False
    )


def comparable(topo: CxlTopology) -> dict[str, list[Any]]:
    """The topology's objects with the fields libcxl cannot supply set to defaults."""
    out: dict[str, list[Any]] = {}
    for kind in ("buses", "ports", "endpoints", "decoders", "memdevs", "regions", "dax_devices"):
        items = []
        for obj in getattr(topo, kind):
            skip = libcxl_backend.SYSFS_ONLY_FIELDS.get(type(obj).__name__, ())
            defaults = {f.name: f.default for f in dataclasses.fields(obj) if f.name in skip}
            items.append(dataclasses.replace(obj, **defaults) if defaults else obj)
        out[kind] = items
    return out


def backend_differences(a: CxlTopology, b: CxlTopology) -> list[str]:
    """Every field on which two topologies differ, as 'kind name.field: a != b'."""
    ca, cb = comparable(a), comparable(b)
    diffs = []
    for kind in ca:
        xa = {o.name: o for o in ca[kind]}
        xb = {o.name: o for o in cb[kind]}
        diffs += [f"{kind} {n}: only in one backend" for n in xa.keys() ^ xb.keys()]
        for name in xa.keys() & xb.keys():
            for f in dataclasses.fields(xa[name]):
                va, vb = getattr(xa[name], f.name), getattr(xb[name], f.name)
                if f.compare and va != vb:
                    diffs.append(f"{kind} {name}.{f.name}: sysfs {va!r} != libcxl {vb!r}")
    return diffs


# What the kernel leaves in sysfs on a switch or endpoint decoder after its decode is
# reset: the programmed ways, granularity and target list, an endpoint decoder's mode
# (it accepts only 'ram' or 'pmem', never 'none' again), and, when the last endpoint
# below a host bridge detaches (1-way regions), the bridge decoder's range. None of it
# decodes: the port's decoders_committed count and the decoder's region say so, and
# both are compared.
STALE_WHEN_RESET = (
    "interleave_ways", "interleave_granularity", "target_list", "mode", "resource", "size",
)  # fmt: skip


def cxl_state() -> dict[str, Any]:
    """Every CXL object's fields, flattened, as the state an operation must restore."""
    from pycxl.cxl.sysfs_backend import read_topology

    topo = read_topology()
    out: dict[str, Any] = {}
    for kind in ("buses", "ports", "endpoints", "decoders", "memdevs", "regions", "dax_devices"):
        for obj in getattr(topo, kind):
            reset = (
                kind == "decoders" and obj.kind != "root" and not obj.committed and not obj.region
            )
            for f in dataclasses.fields(obj):
                if f.compare and not (reset and f.name in STALE_WHEN_RESET):
                    out[f"{obj.name}.{f.name}"] = getattr(obj, f.name)
    return out


def state_diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [
        f"{k}: {before.get(k)!r} -> {after.get(k)!r}"
        for k in sorted(before.keys() | after.keys())
        if before.get(k) != after.get(k)
    ]


def pages_by_node(mib: int, *policy: str) -> dict[int, int]:
    """Touch a fresh buffer in a child run under ``numactl *policy``; count its pages
    per node as the kernel reports them (move_pages with no target: a status query)."""
    script = os.path.join(REPO, "tests", "kernel", "page_nodes.py")
    out = subprocess.run(
        ["numactl", *policy, sys.executable, script, str(mib)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {int(k): v for k, v in json.loads(out.stdout).items()}


def destroy_all_regions() -> None:
    """Clean-up after a failed test, so the next tests of the boot start fresh: newest
    first, pmem regions too (their data is the tests' own). Memory that cannot be
    offlined keeps its region (and the next test fails clearly) rather than being left
    online with nothing decoding it."""
    from pycxl.cxl import regions
    from pycxl.cxl.sysfs_backend import read_topology

    for r in reversed(read_topology().regions):  # newest first, as the kernel resets them
        regions.destroy_region(r.name, force=True)
