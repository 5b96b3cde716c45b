"""Kernel tests share one boot per topology: each starts from no regions, even when the
test before it failed half-way."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_regions_left() -> Iterator[None]:
    yield
    if os.environ.get("PYCXL_IN_TESTBED") == "1":
        from tests.kernel.kernel_helpers import destroy_all_regions

        destroy_all_regions()
