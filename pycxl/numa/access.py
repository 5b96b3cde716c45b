"""What the platform advertises for reaching memory: latency and bandwidth from the
firmware's ACPI HMAT and, for CXL, the devices' CDAT, as the kernel shows them.

The kernel gives them per NUMA node (``nodeN/accessK/initiators/``: figures for the
initiator nodes linked there) and per CXL region (``regionZ/accessK/``: figures for the
region's best initiators). Access class 0 counts every initiator (GPUs and other devices
too), class 1 only CPUs. Latencies are in nanoseconds; bandwidths in MB/s, which the
kernel's node ABI defines as MiB/s; pycxl gives bytes/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base.sysfs import Sysfs

ACCESS_CLASSES = (0, 1)  # 0: any initiator; 1: CPUs only
CPU_ACCESS = 1
MB = 1 << 20  # the kernel's bandwidth unit (MiB/s in its node ABI)


@dataclass(frozen=True)
class AccessFigures:
    """One access class's advertised figures; None where the kernel has no value."""

    access_class: int
    initiators: tuple[int, ...]  # the nodes they are for; empty: the kernel links none
    read_latency_ns: int | None
    write_latency_ns: int | None
    read_bytes_per_s: int | None
    write_bytes_per_s: int | None

    @property
    def empty(self) -> bool:
        """No figure at all (the kernel made the directory but knows nothing)."""
        return all(
            v is None
            for v in (self.read_latency_ns, self.write_latency_ns, self.read_bytes_per_s,
                      self.write_bytes_per_s)
        )  # fmt: skip


def _figures(fs: Sysfs, base: str, cls: int, initiators: tuple[int, ...]) -> AccessFigures:
    def bw(name: str) -> int | None:
        v = fs.read_int(f"{base}/{name}")
        return v * MB if v else None  # 0: not given

    def lat(name: str) -> int | None:
        v = fs.read_int(f"{base}/{name}")
        return v if v else None

    return AccessFigures(cls, initiators, lat("read_latency"), lat("write_latency"),
                         bw("read_bandwidth"), bw("write_bandwidth"))  # fmt: skip


def read_node_access(fs: Sysfs, node_dir: str) -> tuple[AccessFigures, ...]:
    """A node's advertised figures, by access class (none where the kernel has none)."""
    out = []
    for cls in ACCESS_CLASSES:
        base = f"{node_dir}/access{cls}/initiators"
        if not fs.is_dir(base):
            continue
        inits = tuple(
            sorted(
                int(e[4:]) for e in fs.listdir(base) if e.startswith("node") and e[4:].isdecimal()
            )
        )
        f = _figures(fs, base, cls, inits)
        if not f.empty:
            out.append(f)
    return tuple(out)


def read_region_access(fs: Sysfs, region_dir: str) -> tuple[AccessFigures, ...]:
    """A CXL region's advertised figures (Linux 6.10+), by access class."""
    out = []
    for cls in ACCESS_CLASSES:
        base = f"{region_dir}/access{cls}"
        if not fs.is_dir(base):
            continue
        f = _figures(fs, base, cls, ())
        if not f.empty:
            out.append(f)
    return tuple(out)


def cpu_figures(access: tuple[AccessFigures, ...]) -> AccessFigures | None:
    """The figures for CPUs: access class 1, else class 0 (what the kernel has)."""
    by_class = {a.access_class: a for a in access}
    return by_class.get(CPU_ACCESS) or by_class.get(0)
