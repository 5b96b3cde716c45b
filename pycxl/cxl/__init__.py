"""The CXL object model and the backends that read it from the kernel.

Each name loads its module on first use: a host without CXL never loads the model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base._lazy import lazy_exports

if TYPE_CHECKING:
    from .model import Bus, DaxDevice, Decoder, Dport, Mapping, Memdev, Port, Region
    from .topology import CxlTopology

_LAZY = {
    **dict.fromkeys(
        ("Bus", "DaxDevice", "Decoder", "Dport", "Mapping", "Memdev", "Port", "Region"), "model"
    ),
    "CxlTopology": "topology",
}

__all__ = [
    "Bus",
    "CxlTopology",
    "DaxDevice",
    "Decoder",
    "Dport",
    "Mapping",
    "Memdev",
    "Port",
    "Region",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
