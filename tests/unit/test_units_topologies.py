from __future__ import annotations

import pytest

from pycxl.base.errors import InvalidRequestError, NotFoundError
from pycxl.base.units import format_size, format_size_ndctl, parse_size
from pycxl.testbed import TOPOLOGIES, topology


@pytest.mark.parametrize(
    ("text", "value"),
    [("4096", 4096), ("0x1000", 4096), ("4k", 4096), ("256M", 256 << 20), ("1.5G", 3 << 29),
     ("2GiB", 2 << 30), (512, 512)],
)  # fmt: skip
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["", "12Q", "-1", "1.3k", "lots"])
def test_parse_size_rejects(bad: str) -> None:
    with pytest.raises(InvalidRequestError, match="size"):
        parse_size(bad)


def test_format_size() -> None:
    assert format_size(512 << 20) == "512.00 MiB"
    assert format_size_ndctl(4 << 30) == "4.00 GiB (4.29 GB)"


def test_topologies_build_qemu_args() -> None:
    four = TOPOLOGIES["four-dev"]
    args = " ".join(four.qemu_args())
    assert "cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.targets.1=cxl.2" in args
    assert args.count("cxl-type3") == 4 and four.serials == (0x11, 0x12, 0x21, 0x22)
    assert "persistent-memdev" not in args and "lsa=" not in args  # volatile only
    with pytest.raises(NotFoundError, match="known: four-dev, pmem-dev, two-dev"):
        topology("eight-dev")
    pmem = " ".join(TOPOLOGIES["pmem-dev"].qemu_args())
    assert pmem.count("persistent-memdev=pmem") == 2 and pmem.count(",lsa=lsa") == 2
    assert "memory-backend-ram,id=lsa81,share=on,size=1048576" in pmem
