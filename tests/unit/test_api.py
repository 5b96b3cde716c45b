"""The library as people discover it: dir(), help(), docstrings on every public name,
useful reprs, one return convention for measurements, and bad keyword values refused."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import pydoc
from pathlib import Path

import pytest

import pycxl
from pycxl.base.errors import InvalidRequestError

API = ["snapshot", "System", "allocate", "migrate", "host_memory", "create_region",
       "destroy_region", "enable_region", "disable_region", "RegionRequest", "NumaBuffer",
       "Policy", "list_json", "ListRequest", "bench", "PycxlError"]  # fmt: skip
MEASUREMENTS = ["measure_latency", "measure_bandwidth", "measure_first_touch",
                "measure_transfer", "measure_matrix", "latency_sweep_sizes"]  # fmt: skip


def test_dir_and_help_show_the_api() -> None:
    assert set(API) <= set(dir(pycxl))
    text = pydoc.render_doc(pycxl, renderer=pydoc.plaintext)
    for name in ("snapshot", "allocate", "create_region", "host_memory", "RegionRequest"):
        assert name in text
    assert set(MEASUREMENTS) <= set(dir(pycxl.bench)) and set(pycxl.bench.__all__) >= set(
        MEASUREMENTS
    )


def _public_members() -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for info in pkgutil.walk_packages(pycxl.__path__, "pycxl."):
        if info.name == "pycxl._bench" or info.name.startswith("pycxl.cli"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != info.name:
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                out.append((f"{info.name}.{name}", obj))
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    f = member.fget if isinstance(member, property) else member
                    f = getattr(f, "__func__", f)
                    if inspect.isfunction(f):
                        out.append((f"{info.name}.{name}.{attr}", f))
    return out


def test_every_public_function_class_and_method_has_a_docstring() -> None:
    members = _public_members()
    missing = [name for name, obj in members if not (inspect.getdoc(obj) or "").strip()]
    assert len(members) > 150 and missing == []


def test_reprs_say_what_an_object_is(trees: Path) -> None:
    s = pycxl.snapshot(str(trees / "two-dev/region"), gpus=False)
    text = repr(s)
    assert "2 memdevs, 1 regions" in text and "cxl0=node1" in text and len(text) < 200
    assert "region0" in repr(s.cxl) and len(repr(s.cxl)) < 200
    with pycxl.allocate("1M", "dram0") as buf:
        assert repr(buf).startswith("NumaBuffer(1.00 MiB, bind")
    assert "NumaBuffer" in repr(buf) and "closed" in repr(buf)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: pycxl.allocate("1M", "dram0", huge="bogus"), "huge='bogus'"),
        (lambda: pycxl.RegionRequest(type="nvram"), "type 'nvram'"),  # type: ignore[arg-type]
        (lambda: pycxl.RegionRequest(zone="fast"), "zone 'fast'"),  # type: ignore[arg-type]
        (lambda: pycxl.RegionRequest(size="0"), "size must be positive"),
        (lambda: pycxl.snapshot(backend="magic"), "backend 'magic'"),  # type: ignore[arg-type]
        (lambda: pycxl.bench.measure_bandwidth("dram0", kernel="fma"), "kernel 'fma'"),
        (lambda: pycxl.bench.measure_latency("dram0", page="1g"), "page size '1g'"),
        (lambda: pycxl.bench.measure_transfer("gpu0", "dram0", memory="magic"),
         "memory 'magic'"),
        (lambda: pycxl.ListRequest(kinds=frozenset({"cats"})), "unknown object kind 'cats'"),
    ],
)  # fmt: skip
def test_bad_keyword_values_are_errors(call: object, message: str) -> None:
    with pytest.raises((InvalidRequestError, pycxl.NotFoundError), match=message):
        call()  # type: ignore[operator]


def test_sizes_as_strings_wherever_the_cli_takes_them() -> None:
    assert pycxl.RegionRequest(size="512M", granularity="4k").size_bytes == 512 << 20
    (r,) = pycxl.bench.measure_latency("dram0", size="64K", samples=1, loads=1 << 14)
    assert r.size == 64 << 10


def test_the_version_has_one_source() -> None:
    from importlib.metadata import version

    assert version("pycxl") == pycxl.__version__
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert pycxl.__version__ not in pyproject and 'dynamic = ["version"]' in pyproject


def test_the_public_api_takes_the_host_one_way() -> None:
    """Every public function that takes a host takes it as ``system=`` (a recorded tree
    is a System too: pycxl.snapshot(path), the one call that reads a tree by its
    folder); the earlier ``sysroot=`` is gone."""
    takers = []
    for name in pycxl.__all__:
        obj = getattr(pycxl, name)
        if not inspect.isfunction(obj) or name == "snapshot":
            continue
        params = inspect.signature(obj).parameters
        assert "sysroot" not in params, name
        if "system" in params:
            takers.append(name)
    assert {"allocate", "create_region", "disable_memdev", "map_dax"} <= set(takers)
