"""A GPU's nearest host NUMA node, and where that came from."""

from __future__ import annotations

from collections.abc import Callable

from ..base.sysfs import Sysfs

# Where a GPU's nearest node came from, as list -G and the JSON's numa_node_source say it.
DRIVER = "driver"  # the NVIDIA driver: NVML's memory affinity, or CUDA's HOST_NUMA_ID
SYSFS = "sysfs"  # the kernel: the PCI device's numa_node
ONLY_CPU_NODE = "only-cpu-node"  # neither says, and the host has one node with CPUs
NONE = "none"


def nearest_node(
    fs: Sysfs, bus_id: str, ask_driver: Callable[[], int | None] | None = None
) -> tuple[int | None, str]:
    """(node, source): the PCI device's ``numa_node``, else the host's only node with CPUs,
    else the node the driver names (``ask_driver``), else unknown. The kernel writes -1
    for a device its firmware placed in no node (a one-node VM, a BIOS without proximity
    data); on a host whose CPUs are all in one node, that node is the nearest, whatever
    the device's bus. The driver is asked last: NVML's memory affinity takes about 11 ms
    per GPU on the H200 host (most of ``pycxl list``'s GPU time), and where the kernel
    knows the node the driver reads the same firmware tables."""
    from ..numa.nodes import NODE_DIR
    from ..pci.devices import device_numa_node

    node = device_numa_node(bus_id, fs)
    if node is not None:
        return node, SYSFS
    cpu_nodes = fs.read_cpulist(f"{NODE_DIR}/has_cpu")
    if cpu_nodes is not None and len(cpu_nodes) == 1:
        return cpu_nodes[0], ONLY_CPU_NODE
    driver_node = ask_driver() if ask_driver is not None else None
    if driver_node is not None and driver_node >= 0:
        return driver_node, DRIVER
    return None, NONE
