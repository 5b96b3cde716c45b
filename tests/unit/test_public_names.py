"""Public names: every one the README and docs mention is importable from where they
say, and each lazily exporting package's typing imports name exactly its export table
(the table is the one list; the imports only tell type checkers)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_DOTTED = re.compile(r"(?<![\w.])pycxl(?:\.[A-Za-z_]\w*)+")
_FROM = re.compile(r"\bfrom (pycxl(?:\.\w+)*) import ([\w, ]+)")
_BENCH_CALL = re.compile(r"(?<![\w.])bench\.([a-z_]\w*)\(")  # after `from pycxl import bench`


def mentioned() -> list[tuple[str, str]]:
    """(where, dotted name) for each public pycxl name the docs write."""
    out: set[tuple[str, str]] = set()
    for doc in DOCS:
        text = doc.read_text()
        where = doc.relative_to(ROOT).as_posix()
        out |= {(where, m.group(0)) for m in _DOTTED.finditer(text)}
        for module, names in _FROM.findall(text):
            out |= {(where, f"{module}.{n.strip()}") for n in names.split(",") if n.strip()}
        if "from pycxl import bench" in text:
            out |= {(where, f"pycxl.bench.{m.group(1)}") for m in _BENCH_CALL.finditer(text)}
    return sorted(out)


def resolve(dotted: str) -> object:
    """The object ``dotted`` names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


NAMES = mentioned()


def test_the_docs_mention_names_from_each_floor() -> None:
    names = {n for _, n in NAMES}
    # the scan finds the by-name API, a measurement module and a GPU wrapper
    assert {"pycxl.snapshot", "pycxl.bench.measure_latency"} <= names
    assert "pycxl.measure.latency.chase_latency" in names
    assert "pycxl.gpu.memory.DeviceMemory" in names


@pytest.mark.parametrize(("where", "dotted"), NAMES, ids=[f"{w}:{n}" for w, n in NAMES])
def test_every_name_the_docs_mention_is_importable_there(where: str, dotted: str) -> None:
    try:
        resolve(dotted)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{where} mentions {dotted}, which does not import: {e}")


LAZY_PACKAGES = sorted(
    str(p.parent.relative_to(ROOT)).replace("/", ".")
    for p in (ROOT / "pycxl").rglob("__init__.py")
    if "lazy_exports(" in p.read_text()
)


def _typing_imports(path: Path, package: str) -> dict[str, str]:
    """name -> absolute module of each import under ``if TYPE_CHECKING:``."""
    out: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for imp in node.body:
            assert isinstance(imp, ast.ImportFrom), ast.unparse(imp)
            base = package.split(".")
            base = base[: len(base) - imp.level + 1] if imp.level else []
            module = ".".join(base + ([imp.module] if imp.module else []))
            for alias in imp.names:
                out[alias.asname or alias.name] = module
    return out


def test_lazy_packages_are_found() -> None:
    assert {"pycxl", "pycxl.bench", "pycxl.gpu"} <= set(LAZY_PACKAGES)


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_the_typing_imports_are_the_export_table(package: str) -> None:
    mod = importlib.import_module(package)
    table: dict[str, str] = mod._LAZY
    path = ROOT / package.replace(".", "/") / "__init__.py"
    typing = _typing_imports(path, package)
    if not typing:
        pytest.skip(f"{package} declares no typing imports")
    # submodules exported by name ('' in the table) need no typing import
    wanted = {name: _absolute(package, where) for name, where in table.items() if where}
    typing = {name: module for name, module in typing.items() if table.get(name) != ""}
    assert typing == wanted
    assert set(mod.__all__) >= set(table)
    for name in table:
        getattr(mod, name)  # each loads from where the table says


def _absolute(package: str, where: str) -> str:
    """'cxl.read' in pycxl -> 'pycxl.cxl.read'; '.measure.results' in pycxl.bench ->
    'pycxl.measure.results' (one more dot: beside the package)."""
    up = len(where) - len(where.lstrip("."))
    base = package.split(".")
    return ".".join([*base[: len(base) - up], where.lstrip(".")])


def test_a_users_type_checker_sees_every_exported_name(tmp_path: Path) -> None:
    """mypy --strict in a user's code (the source tree on its path: an editable install
    hides it from mypy) accepts ``from pycxl import X`` for every name a
    lazy package exports (it reads no computed ``__all__``: the typing imports re-export
    each as ``X as X``), and knows each name's type."""
    import os
    import subprocess
    import sys

    lines = []
    for package in LAZY_PACKAGES:
        names = sorted(importlib.import_module(package).__all__)
        lines.append(f"from {package} import {', '.join(names)}")
        lines += [f"reveal_type({n})" for n in names]
    user = tmp_path / "user_code.py"
    user.write_text("\n".join(lines) + "\n")
    p = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        "--follow-imports=silent", str(user)], capture_output=True, text=True,
                       cwd=tmp_path, env={**os.environ, "MYPYPATH": str(ROOT)},
                       check=False)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:]
    revealed = [line for line in p.stdout.splitlines() if "Revealed type" in line]
    assert len(revealed) == sum(line.startswith("reveal_type") for line in lines)
    assert not [line for line in revealed if line.endswith('"Any"')], revealed
