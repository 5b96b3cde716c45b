"""The CXL object model and the backends that read it from the kernel."""

from .model import Bus, DaxDevice, Decoder, Dport, Mapping, Memdev, Port, Region
from .topology import CxlTopology

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
