"""PCI devices as the kernel lists them, no driver needed: the NUMA node of each, and the
NVIDIA GPUs among them. (Their links: ``pci_link.py``; their CXL capability:
``pci_caps.py``.)"""

from __future__ import annotations

from ..base.sysfs import Sysfs

PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_VENDOR = 0x10DE
DISPLAY_CLASS = 0x03  # base class of VGA (0x0300) and 3D (0x0302) controllers


def device_numa_node(device: str, fs: Sysfs | None = None) -> int | None:
    """The NUMA node the kernel gives PCI device ``device`` ('0000:65:00.0'): its host
    bridge's socket. None where the firmware says none (the kernel prints -1)."""
    fs = fs or Sysfs()
    node = fs.read_int(f"{PCI_DEVICES}/{device}/numa_node")
    return node if node is not None and node >= 0 else None


def nvidia_gpus(fs: Sysfs | None = None) -> list[str]:
    """PCI addresses of NVIDIA display and 3D controllers, in bus order (the order of
    pycxl's gpu0, gpu1... when no CUDA_VISIBLE_DEVICES reorders them)."""
    fs = fs or Sysfs()
    out = []
    for dev in fs.listdir(PCI_DEVICES):
        vendor = fs.read(f"{PCI_DEVICES}/{dev}/vendor")
        pci_class = fs.read(f"{PCI_DEVICES}/{dev}/class")
        if vendor is None or pci_class is None:
            continue
        if int(vendor, 16) == NVIDIA_VENDOR and int(pci_class, 16) >> 16 == DISPLAY_CLASS:
            out.append(dev)
    return sorted(out)
