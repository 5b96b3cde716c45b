"""Findings of the expectations: each named node's capacity online, the counts of
regions and memdevs."""

from __future__ import annotations

from ..base.errors import NotFoundError
from ..base.units import format_size
from ..resolve.system import System
from .check_expect import Expectations
from .check_finding import Finding, Severity

# a node may show a little less than it was given: the kernel's memmap of the memory
# can live on the memory itself (memmap_on_memory), 64 bytes per 4 KiB page
CAPACITY_SLACK = 0.97


def expectation_findings(system: System, exp: Expectations) -> list[Finding]:
    """Each expected node's capacity online (within CAPACITY_SLACK) and the expected
    counts of regions and memdevs, against what the system shows."""
    out = []
    for name, want in exp.capacities.items():
        try:
            target = system.resolve(name)
        except NotFoundError:
            out.append(
                Finding(
                    "failure",
                    "capacity",
                    name,
                    f"{name} is expected with {format_size(want)} and is not present",
                    "pycxl list: see which memory this host has",
                    {"target": name},
                )
            )
            continue
        node = target.node
        tier = system.tier(node) if node is not None else None
        have = tier.node.mem_total if tier is not None else 0
        labels = {"target": name} | ({} if node is None else {"node": str(node)})
        if have < want * CAPACITY_SLACK:
            out.append(
                Finding(
                    "failure",
                    "capacity",
                    name,
                    f"{name} has {format_size(have)} online; {format_size(want)} expected",
                    "pycxl region create / enable to bring it online",
                    labels,
                )
            )
        else:
            out.append(
                Finding(
                    "ok",
                    "capacity",
                    name,
                    f"{name} has {format_size(have)} ({format_size(want)} expected)",
                    "",
                    labels,
                )
            )
    have_counts = {"regions": len(system.cxl.regions), "memdevs": len(system.cxl.memdevs)}
    for key, want_n in exp.counts.items():
        have_n = have_counts[key]
        sev: Severity = "ok" if have_n == want_n else "failure"
        out.append(
            Finding(
                sev,
                f"{key}-count",
                "host",
                f"{have_n} {key} ({want_n} expected)",
                "" if sev == "ok" else "pycxl list: see what this host has",
            )
        )
    return out
