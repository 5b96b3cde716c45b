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


def pycxl(*args: str) -> subprocess.CompletedProcess[str]:
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


def create_raw_region(serials: str) -> None:
    """A 2-way ram region through the kernel's sysfs protocol, onlined (test set-up)."""
    script = os.path.join(REPO, "scripts", "guest_region_raw.sh")
    env = {**os.environ, "SERIALS": serials}
    subprocess.run(["sh", script], check=True, env=env, capture_output=True, text=True)
