"""``pycxl labels``: this host's memory as schedulers label hosts, so jobs that need CXL
capacity land where it is. One set of facts (tiers, online CXL capacity, whether
GPU-pinned memory stays on the CXL nodes, the check's status), rendered as Slurm node
attributes (``Features=`` and a ``Gres=`` count, for the node's line in slurm.conf)
and as a Kubernetes node-feature-discovery feature file (``features.d``).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Literal

from ..base.jsontype import Json
from ..base.sysfs import Sysfs
from ..base.values import TEN_YEARS_S, count
from ..pci.devices import nvidia_gpus
from ..resolve.system import System
from .check import CheckReport

Format = Literal["slurm", "nfd", "json"]
FORMATS: tuple[Format, ...] = ("slurm", "nfd", "json")
GIB = 1 << 30
# node-feature-discovery takes labels in its own namespace from any local feature file
NFD_NAMESPACE = "feature.node.kubernetes.io"
# the generic resource pycxl's Slurm attributes count (slurm.conf needs GresTypes=cxl_mem)
SLURM_GRES = "cxl_mem"


@dataclass(frozen=True)
class HostLabels:
    """What a scheduler needs to know about this host's memory."""

    tiers: tuple[str, ...]  # dram, cxl, gpu: the kinds of memory present
    cxl_bytes: int  # CXL memory online as NUMA nodes
    cxl_nodes: tuple[str, ...]  # their tier names (cxl0, cxl1...)
    memdevs: int  # CXL memory devices, in a region or not
    gpus: int  # GPUs on the PCI bus
    # every CXL node keeps memory pinned for a GPU (normal zone); None: no CXL node
    gpu_pinning: bool | None
    health: str | None  # pycxl check's status; None when not checked


def host_labels(
    system: System, report: CheckReport | None = None, fs: Sysfs | None = None
) -> HostLabels:
    """The labels of the host ``system`` was read from; ``report``: a check of it, for
    the health label. Nodes named CXL only by PYCXL_CXL_NODES (a study on a host without
    CXL) are not CXL capacity."""
    cxl = [t for t in system.nodes if t.tier == "cxl" and not t.explicit]
    gpus = len(system.gpus.devices) or len(nvidia_gpus(fs or system.sysfs()))
    tiers = [name for name, present in (
        ("dram", any(t.tier == "dram" for t in system.nodes)),
        ("cxl", bool(cxl)),
        ("gpu", gpus > 0),
    ) if present]  # fmt: skip
    pins = [t.holds_longterm_pins for t in cxl]
    return HostLabels(
        tiers=tuple(tiers),
        cxl_bytes=sum(t.node.mem_total for t in cxl),
        cxl_nodes=tuple(t.name for t in cxl),
        memdevs=len(system.cxl.memdevs),
        gpus=gpus,
        gpu_pinning=all(p is True for p in pins) if pins else None,
        health=None if report is None else report.status,
    )


# --- Slurm ----------------------------------------------------------------------------
def slurm_features(labels: HostLabels) -> list[str]:
    """Node features for ``--constraint``: ``cxl``, ``cxl_gib:N`` (whole GiB online),
    ``cxl_pinnable`` (GPU-pinned memory stays on every CXL node)."""
    if "cxl" not in labels.tiers:
        return []
    out = ["cxl", f"cxl_gib:{labels.cxl_bytes // GIB}"]
    if labels.gpu_pinning:
        out.append("cxl_pinnable")
    return out


def slurm_count(size: int) -> str:
    """A GRES count as Slurm reads it: binary suffixes, the largest that is exact."""
    for suffix, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if size and size % (1 << shift) == 0:
            return f"{size >> shift}{suffix}"
    return str(size)


def slurm_attributes(labels: HostLabels) -> str:
    """``Features=... Gres=cxl_mem:no_consume:SIZE``: what to add to this host's
    ``NodeName=`` line in slurm.conf (``slurmd -C`` prints the rest); empty on a host
    without CXL memory online. The GRES is not consumed by jobs: ``--gres=cxl_mem:256G``
    asks for a host with at least that much online."""
    features = slurm_features(labels)
    if not features:
        return ""
    gres = f"Gres={SLURM_GRES}:no_consume:{slurm_count(labels.cxl_bytes)}"
    return f"Features={','.join(features)} {gres}"


# --- node-feature-discovery -----------------------------------------------------------
def nfd_labels(labels: HostLabels) -> dict[str, str]:
    """Label name -> value, in node-feature-discovery's namespace; every value is a
    valid Kubernetes label value (letters, digits, '-', '_', '.')."""
    ns = NFD_NAMESPACE
    out = {f"{ns}/memory-tier.{tier}": "true" for tier in labels.tiers}
    out[f"{ns}/memory-cxl.memdevs"] = str(labels.memdevs)
    out[f"{ns}/memory-cxl.nodes"] = str(len(labels.cxl_nodes))
    out[f"{ns}/memory-cxl.gib"] = str(labels.cxl_bytes // GIB)
    if labels.gpu_pinning is not None:
        out[f"{ns}/memory-cxl.gpu-pinning"] = "true" if labels.gpu_pinning else "false"
    if labels.health is not None:
        out[f"{ns}/memory-cxl.health"] = labels.health
    return out


def nfd_file(
    labels: HostLabels, ttl_s: int | None = None, now: datetime.datetime | None = None
) -> str:
    """A feature file for node-feature-discovery's local source: ``name=value`` lines;
    with ``ttl_s``, an ``# +expiry-time=`` directive first, so that the labels go away
    when pycxl stops refreshing them."""
    now = now or datetime.datetime.now(datetime.UTC)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [f"# pycxl labels --format nfd, {stamp}"]
    if ttl_s is not None:
        ttl_s = count(ttl_s, "ttl (seconds)", 1, TEN_YEARS_S)
        expiry = now + datetime.timedelta(seconds=ttl_s)
        lines.append(f"# +expiry-time={expiry.strftime('%Y-%m-%dT%H:%M:%SZ')}")
    lines += [f"{k}={v}" for k, v in nfd_labels(labels).items()]
    return "\n".join(lines) + "\n"


def host_labels_json(h: HostLabels) -> Json:
    """A host's labels: the facts, with both renderings (Slurm and NFD)."""
    return {
        "tiers": list(h.tiers),
        "cxl_bytes": h.cxl_bytes,
        "cxl_nodes": list(h.cxl_nodes),
        "memdevs": h.memdevs,
        "gpus": h.gpus,
        "gpu_pinning": h.gpu_pinning,
        "health": h.health,
        "slurm": slurm_attributes(h),
        "nfd": nfd_labels(h),
    }
