"""Where the kernel shows CXL and dax devices, the names it gives them, and whether
there is anything there: a host without either reads no more (and loads no CXL model)."""

from __future__ import annotations

import re

from ..sysfs import Sysfs

CXL_DEVICES = "/sys/bus/cxl/devices"
DAX_DEVICES = "/sys/bus/dax/devices"
# the names the kernel gives CXL devices on the bus
PORT_NAME = re.compile(r"^(root|port|endpoint)\d+$")
DECODER_NAME = re.compile(r"^decoder\d+\.\d+$")
REGION_NAME = re.compile(r"^region\d+$")
MEMDEV_NAME = re.compile(r"^mem\d+$")


def bus_present(sysfs: Sysfs | None = None) -> bool:
    """Whether the kernel has a CXL bus (drivers loaded), without reading any device."""
    return (sysfs or Sysfs()).is_dir(CXL_DEVICES)


def nothing_to_read(sysfs: Sysfs) -> bool:
    """No CXL bus and no dax device: the topology is empty."""
    return not bus_present(sysfs) and not sysfs.listdir(DAX_DEVICES)
