"""pycxl's JSON against ndctl 76.1's, both read from the same real-kernel boot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pycxl.byname.listing import ListRequest, list_json
from pycxl.resolve.system import snapshot
from tests.ndctl_compare import compare, flatten

CASES = [
    # tree, ndctl file, request, kinds
    ("two-dev/fresh", "M.json", ListRequest.showing("memdevs"), ("memdev",)),
    ("two-dev/fresh", "D.json", ListRequest.showing("decoders"), ("decoder",)),
    ("two-dev/fresh", "all.json",
     ListRequest.showing("buses", "ports", "endpoints", "memdevs", "decoders", targets=True,
                         include_disabled=True),
     ("bus", "port", "endpoint", "memdev", "decoder")),
    ("two-dev/region", "M.json", ListRequest.showing("memdevs"), ("memdev",)),
    ("two-dev/region", "D.json", ListRequest.showing("decoders"), ("decoder",)),
    ("two-dev/region", "RT.json", ListRequest.showing("regions", targets=True), ("region",)),
    ("four-dev/fresh", "M.json", ListRequest.showing("memdevs"), ("memdev",)),
    ("four-dev/fresh", "D.json", ListRequest.showing("decoders", include_disabled=True),
     ("decoder",)),
    ("four-dev/fresh", "all.json",
     ListRequest.showing("buses", "ports", "endpoints", "memdevs", "decoders", targets=True,
                         include_disabled=True),
     ("bus", "port", "endpoint", "memdev", "decoder")),
]  # fmt: skip


@pytest.mark.parametrize(("tree", "ndctl_file", "req", "kinds"), CASES)
def test_json_equals_ndctl_on_every_common_field(
    trees: Path, tree: str, ndctl_file: str, req: ListRequest, kinds: tuple[str, ...]
) -> None:
    ndctl_doc = json.loads((trees / tree / "ndctl" / ndctl_file).read_text())
    ours = list_json(snapshot(str(trees / tree), gpus=False), req)
    n, diffs = compare(ours, ndctl_doc, kinds)
    assert diffs == []
    expected = sum(1 for k in flatten(ndctl_doc) if k[0] in kinds)
    assert n == expected and n > 0


def test_comparison_catches_a_changed_value(trees: Path) -> None:
    """The comparison is not vacuous: a different size is reported."""
    ndctl_doc = json.loads((trees / "two-dev/region/ndctl/RT.json").read_text())
    ours = list_json(snapshot(str(trees / "two-dev/region"), gpus=False),
                     ListRequest.showing("regions", targets=True))  # fmt: skip
    ours[0]["size"] += 1
    ours[0]["mappings"][0]["memdev"] = "mem9"
    _, diffs = compare(ours, ndctl_doc, ("region",))
    assert len(diffs) == 2
