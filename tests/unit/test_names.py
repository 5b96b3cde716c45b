"""The one grammar for target and initiator names, and a snapshot that reads GPUs only
when a GPU name is resolved."""

from __future__ import annotations

from pathlib import Path

import pytest

from pycxl.base.errors import InvalidRequestError, NotFoundError
from pycxl.gpu import devices
from pycxl.gpu.inventory import GpuInventory
from pycxl.measure.results import bench_result_json
from pycxl.resolve.system import snapshot
from pycxl.resolve.tiers import is_gpu_name, parse_name, parse_names, token


@pytest.mark.parametrize(
    "text,kind",
    [
        ("dram0", "dram"), ("cxl12", "cxl"), ("gpu1", "gpu"), ("node3", "node"),
        ("cpu5", "cpu"), ("all", "all"), ("3", "id"), ("0-2", "range"), ("0-", "range"),
        ("cpu0-3", "other"), ("gpu", "other"), ("foo", "other"), ("3x", "other"),
        ("dram0x", "other"), ("cxl-1", "other"),
    ],
)  # fmt: skip
def test_token_kinds(text: str, kind: str) -> None:
    assert token(text).kind == kind


def test_tokens_keep_numbers_and_lists() -> None:
    assert parse_name(" gpu1 ").number == 1 and parse_name("gpu1").is_gpu
    assert str(parse_name(" cxl0 ")) == " cxl0 " and parse_name(" cxl0 ").text == "cxl0"
    with pytest.raises(NotFoundError, match="did you mean 'cxl0'"):  # case-sensitive
        parse_name(" CXL0 ")
    assert parse_name(2).kind == "id"
    assert token("cpu0-3").id_list == "0-3" and token("cpu0-3").cpu_list == "0-3"
    assert token("0-2").id_list == "0-2" and token("dram0").id_list is None
    assert token("cpux1").id_list is None
    assert token("0-3x", "0-3X").id_list == "0-3X"  # shown as typed in messages
    assert [t.text for t in parse_names(["dram0,cxl0", 3, "dram0"])] == ["dram0", "cxl0", "3"]
    assert is_gpu_name("gpu0") and not is_gpu_name("node0") and not is_gpu_name(0)
    with pytest.raises(InvalidRequestError, match="has an empty item"):
        parse_names("dram0,,cxl0")
    with pytest.raises(InvalidRequestError, match="give a name"):
        parse_name(None)


def test_lazy_snapshot_reads_gpus_when_one_is_named(
    trees: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []

    def read_gpus(sysfs: object = None, *, via: str = "auto") -> GpuInventory:
        reads.append(via)
        return GpuInventory((), None, "no NVIDIA driver")

    monkeypatch.setattr(devices, "read_gpus", read_gpus)
    s = snapshot(str(trees / "two-dev/region"), gpus="lazy")
    assert s.resolve("cxl0").node == 1 and s.memory_nodes("dram0,cxl0") == (0, 1)
    with pytest.raises(NotFoundError):
        s.resolve("cxl7")
    assert reads == [] and "GPUs read when named" in repr(s)
    with pytest.raises(NotFoundError):  # the driver shows none: gpu0 names nothing
        s.resolve("gpu0")
    with pytest.raises(NotFoundError):
        s.resolve("gpu1")
    assert reads == ["auto"]  # once
    assert snapshot(str(trees / "two-dev/region"), gpus=False).gpus.devices == ()
    assert reads == ["auto"]


def test_cpu_lists_and_node_ranges_use_the_grammar(trees: Path) -> None:
    s = snapshot(str(trees / "two-dev/region"), gpus=False)
    assert s.cpus("cpu0-1") == (0, 1) and s.cpus("cpu1,0") == (1, 0)
    assert s.memory_nodes("0-1") == (0, 1) and s.cpu_nodes("all") == (0,)
    with pytest.raises(InvalidRequestError, match="names no CPU"):
        s.cpus("cpu")


def test_results_carry_their_pair_outside_the_json(trees: Path) -> None:
    from pycxl.measure.results import LatencyResult

    p = snapshot(str(trees / "two-dev/region"), gpus=False).pair("cxl0")
    r = LatencyResult(
        **p.result_fields({1: 4}),
        size=4096,
        page_size=4096,
        latency_ns=1.0,
        latency_ns_median=1.0,
        loads=16,
        samples=1,
        stride=64,
        tlb_group=4096,
    )
    assert r.pair is p and r.pair.target.tier == "cxl"
    assert "pair" not in bench_result_json(r) and bench_result_json(r)["target"] == "cxl0"


def test_gpu_names_are_checked_before_the_driver(trees: Path) -> None:
    from pycxl.resolve.tiers import gpu_token

    assert str(gpu_token(" gpu1 ")) == "gpu1" and gpu_token("all").kind == "all"
    with pytest.raises(InvalidRequestError, match="'dram0' is not a GPU"):
        gpu_token("dram0")
    with pytest.raises(InvalidRequestError, match="or all"):
        gpu_token("node1")
    with pytest.raises(InvalidRequestError, match=r"\.\.\.$"):
        gpu_token("all", every=False)


def test_no_other_module_matches_names_with_a_regex() -> None:
    """Target and initiator names are parsed by tiers' grammar only."""
    import re

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"re\.(compile|match|fullmatch|search)\(.*(dram|cxl\||gpu|cpu\||node\|)")
    found = [
        f"{path.relative_to(root)}:{n}"
        for folder in ("pycxl", "cli")
        for path in sorted((root / folder).rglob("*.py"))
        if path.name != "tiers.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
