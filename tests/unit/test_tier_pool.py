"""CUDA memory on a tier, where no GPU is: names are checked before any driver is
loaded, the compiled allocators exist under the names PyTorch loads, and without a CUDA
driver the pool says so (the allocator itself runs in tests/gpu)."""

from __future__ import annotations

import ctypes

import pytest

import pycxl
from pycxl.base._lib import compiled
from pycxl.base.errors import InvalidRequestError, NotAvailableError, NotFoundError
from pycxl.resolve.system import snapshot


def test_the_allocators_pytorch_loads_are_exported_by_name() -> None:
    lib = ctypes.CDLL(compiled.module_path())
    for n in range(compiled.TIER_SLOTS):
        assert getattr(lib, f"pycxl_tier_malloc_{n}") and getattr(lib, f"pycxl_tier_free_{n}")
    assert lib.pycxl_cuda_malloc and lib.pycxl_cuda_free


def test_a_slot_that_is_not_open_allocates_nothing() -> None:
    assert compiled.tier_alloc(3, 1 << 20) == 0
    with pytest.raises(InvalidRequestError, match="not open"):
        compiled.tier_stats(3)
    with pytest.raises(InvalidRequestError, match="not open"):
        compiled.tier_spill_to(5, 0)
    assert compiled.tier_open(compiled.TIER_SLOTS, 0, [0])[0] == -1


def test_without_a_cuda_driver_the_pool_says_so(trees: object) -> None:
    from pycxl.base._lib.libs import LIBCUDA

    if LIBCUDA.available():
        pytest.skip("a CUDA driver is present: tests/gpu runs the pool")
    rc, message = compiled.tier_open(0, 0, [0])
    assert rc == -1 and "libcuda.so.1" in message
    with pytest.raises(NotAvailableError, match="libcuda"):
        pycxl.tier_pool("dram0")


@pytest.mark.parametrize(
    ("target", "error", "said"),
    [
        ("cpu0", InvalidRequestError, "cpu0"),
        ("dram0,dram0", None, None),  # the same node twice is one node
        ("node99", NotFoundError, "node99"),
        ("", InvalidRequestError, ""),
    ],
)
def test_a_tier_is_checked_before_any_driver(
    target: str, error: type | None, said: str | None
) -> None:
    if error is None:
        assert len(snapshot(gpus=False).placement_nodes(target)) == 1
        return
    with pytest.raises(error) as e:
        pycxl.tier_pool(target)
    assert said in str(e.value)


def test_how_pools_make_memory_is_checked_before_any_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYCXL_TIER_MEMORY", "pinned")
    with pytest.raises(InvalidRequestError, match="auto, host-numa, registered"):
        pycxl.tier_pool("dram0")
    # the C side refuses a mode it does not know, and a node beyond its mask, by itself
    assert compiled.tier_open(0, 0, [0], 7)[0] == -1
    assert compiled.tier_open(0, 4096, [0], 0)[0] == -1


def test_a_recorded_tree_gets_no_pool(trees: object) -> None:
    tree = snapshot(sysroot=f"{trees}/two-dev/fresh", gpus=False)
    with pytest.raises(InvalidRequestError, match="recorded tree"):
        pycxl.tier_pool("cxl0", system=tree)


def test_the_summary_says_what_is_on_the_tier() -> None:
    from pycxl.gpu.tier_pool import TierStats

    GiB = 1 << 30
    s = TierStats("cxl0", 1, 4 * GiB, 12 * GiB, 3, 12 * GiB, 1, 0, 12 * GiB, 3, "cuMemCreate: 2")
    text = s.summary()
    assert (
        text.splitlines()[0]
        == "cxl0 (node 1): 4.00 GiB in use, 12.00 GiB at peak, 12.00 GiB mapped"
    )
    assert "3 allocations (12.00 GiB asked), 1 refused" in text and "3 spilled" in text
    assert text.endswith("last refusal: cuMemCreate: 2")


@pytest.mark.parametrize("where", ["dram0", "gpu0"])
def test_move_takes_a_cuda_tensor_before_any_name_or_driver(where: str) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(InvalidRequestError, match="CUDA tensor"):
        pycxl.move(torch.ones(2), where)
