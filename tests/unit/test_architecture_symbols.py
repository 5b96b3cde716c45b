"""docs/architecture.md names only what exists. Every name it quotes as code (a function,
class, attribute, constant, module or file) is one the package, its native sources or its
tests define or use; and a row of its module table names only what that module (or a file
the row names beside it) has. A rename or a removal that the page did not follow fails
here: the page once said bench results carry an ``as_json`` of their own and that
``counters`` holds ``open_readers``, which lives in ``ops/top.py``."""

from __future__ import annotations

import ast
import builtins
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
TOOLS = {"ptxas"}  # programs the page names, not symbols
SUFFIXES = ("py", "h", "c", "ptx", "md", "sh", "toml")


@cache
def names_in(path: Path) -> frozenset[str]:
    """The identifiers a source file (or every file of a folder) defines or uses, and the
    words of its strings (sysfs attribute names, environment variables)."""
    if path.is_dir():
        return frozenset().union(*(names_in(p) for p in sorted(path.rglob("*")) if p.is_file()))
    names = {path.stem}
    if path.suffix == ".py":
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
                      and node.body and isinstance(node.body[0], ast.Expr)}  # fmt: skip
        for n in ast.walk(tree):
            if id(n) in docstrings:  # prose, as the page is: not what the code has
                continue
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(n.name)
            elif isinstance(n, ast.Name):
                names.add(n.id)
            elif isinstance(n, ast.Attribute):
                names.add(n.attr)
            elif isinstance(n, ast.arg):
                names.add(n.arg)
            elif isinstance(n, ast.alias):
                names.add((n.asname or n.name).split(".")[-1])
            elif isinstance(n, ast.keyword) and n.arg:
                names.add(n.arg)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                names.update(re.findall(r"[A-Za-z_]\w*", n.value))
    elif path.suffix in (".c", ".h", ".ptx"):
        names.update(re.findall(r"[A-Za-z_]\w*", path.read_text()))
    return frozenset(names)


@cache
def everywhere() -> frozenset[str]:
    """What the package, its native sources and its tests (not their data) have."""
    tests = [p for p in (ROOT / "tests").rglob("*.py")
             if "data" not in p.relative_to(ROOT).parts and p != Path(__file__)]  # fmt: skip
    bases = [ROOT / "pycxl", ROOT / "cli", ROOT / "native", *tests]
    return TOOLS.union(*(names_in(b) for b in bases))


def quoted(text: str) -> list[str]:
    """What ``text`` quotes as code that has the shape of a (dotted) name or a path,
    calls' arguments dropped."""
    out = []
    for token in re.findall(r"`([^`\n]+)`", text):
        name = re.sub(r"\(.*\)$", "", token.strip())
        if re.fullmatch(r"[A-Za-z_][\w/]*(\.[A-Za-z_]\w*)*/?", name):
            out.append(name)
    return out


def parts_of(name: str) -> list[str]:
    """The identifiers a quoted name is made of (a file's suffix and folders dropped)."""
    parts = name.rstrip("/").split("/")[-1].split(".")
    return parts[:-1] if len(parts) > 1 and parts[-1] in SUFFIXES else parts


def unknown(names: list[str], known: frozenset[str]) -> list[str]:
    return [f"{n} ({p})" for n in names if not (ROOT / n).exists()
            for p in parts_of(n) if p not in known]  # fmt: skip


def test_every_name_the_page_quotes_exists_somewhere() -> None:
    missing = unknown(quoted(PAGE.read_text()), everywhere())
    assert not missing, f"docs/architecture.md names what the code lacks: {missing}"


def module_rows(text: str) -> list[tuple[Path, list[str]]]:
    """(module, the names its row's description quotes) for each row of the module
    table (``| `pycxl/x.py` | floor | what it holds |``)."""
    out = []
    for path, rest in re.findall(
        r"^\| `((?:pycxl|cli|native)/[^`]+)` \| \d \| (.*)\|$", text, re.M
    ):
        out.append((ROOT / path, quoted(rest)))
    return out


def test_a_module_rows_names_are_that_modules() -> None:
    import pycxl

    modules = {p.stem for p in (ROOT / "pycxl").rglob("*.py")}
    modules |= {p.name for p in (ROOT / "pycxl").iterdir()} | set(dir(builtins))
    missing = []
    for module, names in module_rows(PAGE.read_text()):
        # a package's row speaks of its modules; a row may name other files beside
        scope = [module.parent if module.name == "__init__.py" else module]
        scope += [base / n for n in names for base in (ROOT, ROOT / "pycxl", module.parent)
                  if (base / n).is_file()]  # fmt: skip
        known = frozenset(set(pycxl.__all__) | modules).union(*(names_in(p) for p in scope))
        dotted = [n for n in names if "." in n and "/" not in n and not (ROOT / n).exists()]
        plain = [n for n in names if n not in dotted and n.split(".")[-1] not in SUFFIXES]
        missing += [f"{module.relative_to(ROOT)}: {m}" for m in unknown(plain, known)]
        # a dotted name's last part is its module's (to_json.bench_result_json)
        missing += [f"{module.relative_to(ROOT)}: {n}" for n in dotted
                    if n.split(".")[-1] not in known | everywhere()]  # fmt: skip
    assert not missing, f"rows of docs/architecture.md's module table: {missing}"


def test_the_check_finds_what_the_page_once_said() -> None:
    results = ROOT / "pycxl" / "measure" / "results.py"
    assert "as_json" not in names_in(results)
    counters = ROOT / "pycxl" / "counters" / "__init__.py"
    assert "open_readers" not in names_in(counters)
    row = "| `pycxl/measure/results.py` | 1 | one JSON shape (`as_json`) |"
    assert module_rows(row) == [(results, ["as_json"])]
