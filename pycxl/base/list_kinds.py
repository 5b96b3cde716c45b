"""The kinds of object ``pycxl list`` knows, declared once: its flags, filters and JSON
containers are made from this table (``pycxl.byname.listing``, ``pycxl list``).

Kept free of imports, so the command line can build its options without loading the
library.
"""

from __future__ import annotations

from typing import NamedTuple


class Kind(NamedTuple):
    """One kind of object ``pycxl list`` can show. (A named tuple: a fixed table, and a
    command that starts on every node of a job builds it in a tenth of a dataclass's time.)"""

    name: str  # selection key: 'memdevs', 'decoders'...
    singular: str  # 'memdev': its filter's long option and error wording
    flag: str  # its kind flag: 'M' for -M/--memdevs
    help: str
    filter_flag: str | None = None  # its filter option: 'm' for -m/--memdev ID
    filter_metavar: str = "ID"
    container: str = ""  # JSON container name, when not ``name``
    cxl: bool = True  # a CXL object (filters relate to it)

    @property
    def json_name(self) -> str:
        """The kind's JSON container name."""
        return self.container or self.name


KINDS: tuple[Kind, ...] = (
    Kind("buses", "bus", "B", "CXL buses (platform roots).", "b", "NAME|ID|PROVIDER"),
    Kind("ports", "port", "P", "Switch and host-bridge ports.", "p",
         "NAME|ID|root|switch|endpoint"),
    Kind("endpoints", "endpoint", "E", "Endpoint ports.", "e", "NAME|ID"),
    Kind("memdevs", "memdev", "M", "CXL memory devices.", "m", "NAME|ID|SERIAL|HOST"),
    Kind("decoders", "decoder", "D", "HDM decoders (root, switch, endpoint).", "d",
         "NAME|X.Y|root|switch|endpoint"),
    Kind("regions", "region", "R", "CXL regions.", "r", "NAME|ID"),
    Kind("dax", "dax device", "X", "Dax devices fed by CXL regions."),
    Kind("numa", "NUMA node", "N", "NUMA nodes with their tier names.", container="numa_nodes",
         cxl=False),
    Kind("gpus", "GPU", "G", "GPUs with their nearest NUMA node.", cxl=False),
)  # fmt: skip
KIND_NAMES = tuple(k.name for k in KINDS)
SINGULAR = {k.name: k.singular for k in KINDS}
# What the summary (no flag, no filter) shows.
SUMMARY_KINDS = ("memdevs", "regions", "numa", "gpus")
