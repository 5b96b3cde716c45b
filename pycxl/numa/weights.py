"""Weighted-interleave weights from bandwidth: the rule, on its own.

The same rule as the kernel's auto mode (Linux 6.16, mm/mempolicy.c), applied to
measured bandwidths instead of advertised ones: each node's share of the total bandwidth,
times WEIGHTINESS, rounded down and at least 1; then all divided by their greatest common
divisor (1:2 interleaves as well as 16:32, in shorter rounds). The result is in the
kernel's range (1..255).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..base.errors import InvalidRequestError

WEIGHTINESS = 32  # the kernel's scale for auto weights (mm/mempolicy.c)
RULE = (
    f"weight = {WEIGHTINESS} x the node's share of the total bandwidth, rounded down, at "
    "least 1; then all divided by their greatest common divisor (the kernel's rule for "
    "auto weights, Linux 6.16)"
)


def weights_from_bandwidth(bandwidth: Mapping[int, float]) -> dict[int, int]:
    """Node -> weight, proportional to node -> bandwidth (bytes/s, all positive)."""
    if not bandwidth:
        raise InvalidRequestError("weights need the bandwidth of at least one node")
    bad = [n for n, bw in bandwidth.items() if not bw > 0]
    if bad:
        raise InvalidRequestError(f"node {bad[0]} has no measured bandwidth")
    whole = {n: max(1, round(bw)) for n, bw in bandwidth.items()}  # bytes/s, exact division
    total = sum(whole.values())
    raw = {n: max(1, WEIGHTINESS * bw // total) for n, bw in whole.items()}
    gcd = math.gcd(*raw.values())
    return {n: w // gcd for n, w in raw.items()}
