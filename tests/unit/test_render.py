"""pycxl draws its tables itself (tabulate costs as much to import as pycxl list takes to
run); they must stay what tabulate's "simple" format prints, character for character."""

from __future__ import annotations

import pytest
from pycxl.cli.render import ranges, table
from tabulate import tabulate

CASES = [
    (["node", "name"], [[0, "dram0"], [1, "cxl0"]]),
    (["h1", "header2"], [["a", "bbbbbb"], ["ccc", "d"]]),
    (["a", "b", "c"], [["x", None, "z"], ["", "y", None]]),
    (["region", "mappings", "numa node"], [["region0", "0:mem0 1:mem1", "1 (cxl0)"]]),
    (["gpu", "name"], [["gpu0", "NVIDIA H200 日本"]]),
    (["", "dram0", "cxl0"], [["dram0", "10", "20"]]),
]


@pytest.mark.parametrize(("headers", "rows"), CASES)
def test_tables_are_tabulates_simple_format(headers: list[str], rows: list[list[object]]) -> None:
    ours = table(headers, rows)
    theirs = tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)
    assert ours == theirs


def test_cpu_ranges() -> None:
    assert ranges((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    assert ranges(()) == "-" and ranges((5,)) == "5"
