"""Record the parts of a live sysfs that pycxl reads into a directory tree.

The recorded trees under tests/data come from the testbed's real kernel (see
scripts/record_trees.py). Links are kept as relative links; the targets of links the
code follows (driver, dport, physical_node...) are kept as empty directories so that
existence checks behave as on the live system.

Usage (inside the testbed guest): python3 scripts/record_sysfs.py DEST
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

# Whole subtrees copied for every CXL and dax device (the device's real directory).
BUS_DIRS = ("/sys/bus/cxl/devices", "/sys/bus/dax/devices")
# Other attribute trees pycxl reads (globs expand on the live system).
EXTRA_TREES = (
    "/sys/devices/system/node",
    "/sys/devices/system/memory",
    "/sys/devices/system/cpu/online",
    "/sys/devices/system/cpu/possible",
    "/sys/devices/system/cpu/cpu*/cache",
    "/sys/kernel/mm/mempolicy",
    "/sys/kernel/mm/transparent_hugepage",
    "/sys/kernel/mm/numa",
    "/sys/devices/virtual/memory_tiering",
    "/proc/vmstat",
    "/proc/sys/kernel/numa_balancing",
)
# Of every PCI device: what pycxl check and list read (PCIe link state, GPU
# identification, the configuration space with a CXL device's DVSEC: root reads it whole).
PCI_DEVICES = "/sys/bus/pci/devices"
PCI_ATTRS = (
    "config",
    "vendor",
    "device",
    "class",
    "current_link_speed",
    "max_link_speed",
    "current_link_width",
    "max_link_width",
    "numa_node",
)
SKIP_DIRS = {"power", "firmware", "subsystem", "driver", "msi_irqs", "consumer", "supplier"}
MAX_FILE = 1 << 16


def record(dest: Path, root: str = "/") -> int:
    """Copy the attributes into ``dest``; returns the number of files written."""
    rec = _Recorder(Path(dest), root)
    for bus in BUS_DIRS:
        rec.bus(bus)
    for pattern in EXTRA_TREES:
        for live in sorted(glob.glob(rec.live(pattern))):
            rec.tree("/" + os.path.relpath(live, root))
    rec.pci()
    rec.finish_links()
    # git keeps no empty directory: mark link targets so a clone still resolves them
    for path, dirs, files in os.walk(dest):
        if not dirs and not files:
            Path(path, ".keep").touch()
    return rec.files


class _Recorder:
    def __init__(self, dest: Path, root: str) -> None:
        self.dest = dest
        self.root = root
        self.files = 0
        self.links: list[str] = []  # kernel paths of recorded links

    def live(self, kpath: str) -> str:
        return os.path.join(self.root, kpath.lstrip("/"))

    def out(self, kpath: str) -> Path:
        return self.dest / kpath.lstrip("/")

    def bus(self, busdir: str) -> None:
        live = self.live(busdir)
        if not os.path.isdir(live):
            return
        for name in sorted(os.listdir(live)):
            self.link(f"{busdir}/{name}")
            real = os.path.realpath(os.path.join(live, name))
            self.tree("/" + os.path.relpath(real, self.root))

    def pci(self) -> None:
        live = self.live(PCI_DEVICES)
        if not os.path.isdir(live):
            return
        for name in sorted(os.listdir(live)):
            self.link(f"{PCI_DEVICES}/{name}")
            real = "/" + os.path.relpath(os.path.realpath(os.path.join(live, name)), self.root)
            for attr in PCI_ATTRS:
                if os.path.isfile(self.live(f"{real}/{attr}")):
                    self.file(f"{real}/{attr}")

    def link(self, kpath: str) -> None:
        out = self.out(kpath)
        out.parent.mkdir(parents=True, exist_ok=True)
        if not out.is_symlink():
            out.symlink_to(os.readlink(self.live(kpath)))
        self.links.append(kpath)

    def tree(self, kpath: str) -> None:
        live = self.live(kpath)
        if os.path.islink(live):
            self.link(kpath)
        elif os.path.isfile(live):
            self.file(kpath)
        elif os.path.isdir(live):
            self.out(kpath).mkdir(parents=True, exist_ok=True)
            for name in sorted(os.listdir(live)):
                if name in SKIP_DIRS and os.path.isdir(os.path.join(live, name)):
                    if os.path.islink(os.path.join(live, name)):
                        self.link(f"{kpath}/{name}")
                    continue
                self.tree(f"{kpath}/{name}")

    def file(self, kpath: str) -> None:
        live = self.live(kpath)
        try:
            with open(live, "rb") as f:
                data = f.read(MAX_FILE + 1)
        except OSError:
            data = b""  # write-only or state-dependent attribute: keep it, empty
        if len(data) > MAX_FILE:
            return
        out = self.out(kpath)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        os.chmod(out, os.stat(live).st_mode & 0o777 | 0o200)
        self.files += 1

    def finish_links(self) -> None:
        """Give followed links a target, with the links pycxl reads beneath them."""
        for kpath in list(self.links):
            real = os.path.realpath(self.live(kpath))
            if not os.path.isdir(real):
                continue
            kreal = "/" + os.path.relpath(real, self.root)
            target = self.out(kreal)
            target.mkdir(parents=True, exist_ok=True)
            for sub in ("physical_node", "firmware_node"):
                live_sub = os.path.join(real, sub)
                if os.path.islink(live_sub) and not (target / sub).is_symlink():
                    (target / sub).symlink_to(os.readlink(live_sub))
                    sub_real = os.path.realpath(live_sub)
                    self.out("/" + os.path.relpath(sub_real, self.root)).mkdir(
                        parents=True, exist_ok=True
                    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python3 scripts/record_sysfs.py DEST\n")
        return 2
    n = record(Path(args[0]))
    sys.stdout.write(f"recorded {n} files into {args[0]}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
