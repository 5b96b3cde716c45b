"""The one-floor rule, checked on the source: no module imports a module of a higher
floor (docs/architecture.md). Names are resolved on floor 2 only; floors 0-1 take ids.
No import circles either, inside a floor, except one declared pair."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# module name prefix -> floor; the longest matching prefix decides
FLOORS = {
    "pycxl.errors": 0, "pycxl.units": 0, "pycxl.sysfs": 0, "pycxl.plan": 0,
    "pycxl.waiting": 0, "pycxl.list_kinds": 0, "pycxl._lib": 0, "pycxl.native": 0,
    "pycxl._bench": 0, "pycxl._lazy": 0, "pycxl.trace": 0, "pycxl.outfiles": 0,
    "pycxl._log": 0, "pycxl.values": 0, "pycxl.jsontype": 0,
    "pycxl.cxl": 1, "pycxl.numa": 1, "pycxl.gpu": 1, "pycxl.torch": 1, "pycxl.measure": 1,
    "pycxl.testbed": 1,
    "pycxl.pci": 1, "pycxl.pci_link": 1, "pycxl.pci_caps": 1, "pycxl.targets": 1,
    "pycxl.counters": 1,
    "pycxl.tiers": 2, "pycxl.system": 2,
    "pycxl": 3, "pycxl.facade": 3, "pycxl.bench": 3, "pycxl.listing": 3, "pycxl.memdev_health": 3,
    "pycxl.to_json": 3,
    "pycxl.cli": 4,
}  # fmt: skip


def floor(module: str) -> int:
    """A module's floor: its longest prefix's, the same for a package and its modules
    (no exceptions)."""
    best = max((p for p in FLOORS if module == p or module.startswith(p + ".")), key=len)
    return FLOORS[best]


def modules() -> list[tuple[str, Path, bool]]:
    """(module name, file, is a package __init__) for every module of the package."""
    out = []
    for base, prefix in ((ROOT / "pycxl", "pycxl"), (ROOT / "cli", "pycxl.cli"),
                         (ROOT / "native", "pycxl.native")):  # fmt: skip
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out.append((".".join([prefix, *parts]), path, path.name == "__init__.py"))
    return out


def imports(module: str, path: Path, is_package: bool) -> set[str]:
    """Every pycxl module this one imports, anywhere in it (functions included)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # 'from . import x' imports module x
                sub = f"{base}.{alias.name}"
                found.add(sub if _is_module(sub) else base)
    return {m for m in found if m == "pycxl" or m.startswith("pycxl.")}


# Import circles allowed, each a set of modules. Every import counts, those under
# TYPE_CHECKING and inside functions too: a type-only arrow is still one module knowing
# the other. The one allowed is libcxl's shape: a CXL object points back at the
# topology that holds it, and the topology holds the objects.
ALLOWED_CIRCLES = [{"pycxl.cxl.model", "pycxl.cxl.topology"}]


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import circles of ``graph`` (module -> modules it imports): its strongly
    connected parts of more than one module, or of one that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part: set[str] = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1 or v in graph[v]:
                found.append(part)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_graph() -> dict[str, set[str]]:
    """Each module and the pycxl modules it imports (a package's ``__init__`` is its
    own node: importing a package's module runs it, so an arrow to the package counts)."""
    return {m: imports(m, path, p) - {m} for m, path, p in MODULES}


def _is_module(name: str) -> bool:
    return any(name == m for m, _, _ in MODULES)


MODULES = modules()


@pytest.mark.parametrize(("module", "path", "is_package"), MODULES, ids=[m for m, _, _ in MODULES])
def test_no_module_imports_a_higher_floor(module: str, path: Path, is_package: bool) -> None:
    mine = floor(module)
    upward = sorted(
        f"{t} (floor {floor(t)})" for t in imports(module, path, is_package) if floor(t) > mine
    )
    assert upward == [], f"{module} (floor {mine}) imports {upward}"


def test_the_rule_is_checked_on_every_floor() -> None:
    floors = {floor(m) for m, _, _ in MODULES}
    assert floors == {0, 1, 2, 3, 4}
    # it sees relative, aliased and function-level imports
    found = {m: imports(m, path, p) for m, path, p in MODULES}
    assert {"pycxl.targets", "pycxl.numa.launch", "pycxl.tiers"} <= found["pycxl.system"]
    assert "pycxl.cxl.regions" in found["pycxl.facade"]
    assert "pycxl.numa.placement" in found["pycxl.gpu.memory"]  # inside a method
    # and it would catch the kind of import it exists for
    assert floor("pycxl.system") > floor("pycxl.numa.placement")


def test_names_are_parsed_on_the_resolver_floor_only() -> None:
    """tiers' name grammar is used from the resolver and above, never below."""
    for module, path, is_package in MODULES:
        if floor(module) < 2:
            assert "pycxl.tiers" not in imports(module, path, is_package), module
            assert "pycxl.system" not in imports(module, path, is_package), module


def test_no_import_circles() -> None:
    """No module reaches itself through its imports, except the allowed pair: a circle
    makes a module's import order matter, and the two can be understood only together."""
    found = circles(import_graph())
    extra = [sorted(c) for c in found if c not in ALLOWED_CIRCLES]
    assert extra == [], f"import circles: {extra}"


def test_the_circle_check_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(sorted(c) for c in circles(graph)) == [["a", "b", "c"], ["e"]]
    # and the allowed pair is still there to allow (drop it from the list once it goes)
    assert ALLOWED_CIRCLES[0] in circles(import_graph())


def test_the_gpu_driver_floor_imports_no_torch() -> None:
    """pycxl/gpu is the driver floor (CUDA, NVML, memory, streams, the ring): no module
    of it imports PyTorch, nor the package that knows PyTorch (pycxl/torch)."""
    found = []
    for module, path, _ in modules():
        if not module.startswith("pycxl.gpu"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            found += [f"{module}: {n}" for n in names if n.split(".")[0] == "torch"]
        found += [f"{module}: pycxl.torch" for m in imports(module, path, False)
                  if m.startswith("pycxl.torch")]  # fmt: skip
    assert not found, found
