"""The PCIe links of CXL memdevs and GPUs, read, and findings where one runs below what
both its ends support."""

from __future__ import annotations

from ..base.sysfs import Sysfs
from ..pci.devices import nvidia_gpus
from ..pci.link import Link, read_link
from ..resolve.system import System
from .check_finding import Finding


def read_links(system: System, fs: Sysfs) -> dict[str, Link]:
    """The PCIe links of the CXL memdevs and the GPUs (those on the bus where none was
    read), by PCI address."""
    devices = [m.host for m in system.cxl.memdevs]
    gpus = [g.pci_bus_id for g in system.gpus.devices] or nvidia_gpus(fs)
    out = {}
    for dev in [*devices, *gpus]:
        link = read_link(dev, fs)
        if link is not None:
            out[dev] = link
    return out


def link_findings(system: System, links: dict[str, Link]) -> list[Finding]:
    """A link with fewer lanes or a slower speed than both ends support; a GPU's slower
    speed is only noted (GPUs lower it when idle)."""
    owners = {m.host: m.name for m in system.cxl.memdevs}
    gpu_names = {g.pci_bus_id: g.target_name for g in system.gpus.devices}
    out = []
    for dev, link in links.items():
        is_gpu = dev not in owners
        who = gpu_names.get(dev, f"GPU {dev}") if is_gpu else f"{owners[dev]} ({dev})"
        labels = {
            "device": dev,
            ("gpu" if is_gpu else "memdev"): gpu_names.get(dev, dev) if is_gpu else owners[dev],
        }
        limit = " (the upstream port's maximum)" if link.limited_by_port else ""
        if link.device_max_unknown:
            limit = " (the device's own maximum is unreadable: the upstream port's is shown)"
        if link.width_below_max:
            out.append(
                Finding(
                    "warning",
                    "pcie-link",
                    who,
                    f"{who} link {link.describe()}{limit}: fewer lanes than both ends support",
                    "reseat the card or check the slot/riser",
                    labels,
                )
            )
        elif link.speed_below_max and is_gpu:
            out.append(
                Finding(
                    "info",
                    "pcie-link",
                    who,
                    f"{who} link {link.describe()}{limit}: GPUs lower the link "
                    "speed when idle; it rises under load",
                    "",
                    labels,
                )
            )
        elif link.speed_below_max:
            out.append(
                Finding(
                    "warning",
                    "pcie-link",
                    who,
                    f"{who} link {link.describe()}{limit}: slower than both ends support",
                    "check the slot, riser and BIOS link settings",
                    labels,
                )
            )
        else:
            out.append(
                Finding("ok", "pcie-link", who, f"{who} link {link.describe()}{limit}", "", labels)
            )
    return out
