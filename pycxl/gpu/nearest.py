"""A GPU's nearest host NUMA node, and where that came from."""

from __future__ import annotations

from ..sysfs import Sysfs

# Where a GPU's nearest node came from, as list -G and the JSON's numa_node_source say it.
DRIVER = "driver"  # the NVIDIA driver: NVML's memory affinity, or CUDA's HOST_NUMA_ID
SYSFS = "sysfs"  # the kernel: the PCI device's numa_node
ONLY_CPU_NODE = "only-cpu-node"  # neither says, and the host has one node with CPUs
NONE = "none"


def nearest_node(fs: Sysfs, bus_id: str, driver_node: int | None) -> tuple[int | None, str]:
    """(node, source): the driver's node where it names one, else the PCI device's
    ``numa_node``, else the host's only node with CPUs. The kernel writes -1 for a device
    its firmware placed in no node (a one-node VM, a BIOS without proximity data); on a
    host whose CPUs are all in one node, that node is the nearest, whatever the device's
    bus. With CPUs in several nodes and no word from the driver or kernel: unknown."""
    if driver_node is not None and driver_node >= 0:
        return driver_node, DRIVER
    from ..numa.nodes import NODE_DIR
    from ..pcie import device_numa_node  # imported here: the driver's word is the usual answer

    node = device_numa_node(bus_id, fs)
    if node is not None:
        return node, SYSFS
    cpu_nodes = fs.read_cpulist(f"{NODE_DIR}/has_cpu")
    if cpu_nodes is not None and len(cpu_nodes) == 1:
        return cpu_nodes[0], ONLY_CPU_NODE
    return None, NONE
