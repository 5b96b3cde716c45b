"""The one-floor rule, checked on the source: no module imports a module of a higher
floor (docs/architecture.md). Names are resolved on floor 2 only; floors 0-1 take ids.
No import circles either, inside a floor, except one declared pair."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The floors are the folders: each folder of pycxl/ (and cli/, native/) and its floor.
# A module's floor is its folder's; the package's own __init__ is the top of the library
# (floor 3: it exports the by-name API). No module sits loose in pycxl/ but __init__ and
# what the build generates there (the cffi modules _abi_*, _bench).
FOLDERS = {
    "base": 0, "native": 0,
    "cxl": 1, "numa": 1, "gpu": 1, "torch": 1, "measure": 1, "pci": 1, "counters": 1,
    "testbed": 1,
    "resolve": 2,
    "byname": 3, "bench": 3, "ops": 3,
    "cli": 4,
}  # fmt: skip
GENERATED = ("_abi_", "_bench")  # built into pycxl/ at install (setup.py's cffi modules)


def floor(module: str) -> int:
    """A module's floor: its folder's (the same for a package and its modules, no
    exceptions); the package's __init__ and the generated modules' are their own."""
    parts = module.split(".")
    if module == "pycxl":
        return 3
    if len(parts) == 2 and parts[1].startswith(GENERATED):
        return 0
    return FOLDERS[parts[1]]


def test_every_module_lives_in_a_floor_folder() -> None:
    """A newcomer finds a module's floor from its folder: nothing loose in pycxl/, and
    every folder named in the table."""
    loose = [p.name for p in (ROOT / "pycxl").glob("*.py")
             if p.name != "__init__.py" and not p.name.startswith(GENERATED)]  # fmt: skip
    assert loose == [], f"modules outside a floor's folder: {loose}"
    folders = {p.name for p in (ROOT / "pycxl").iterdir()
               if p.is_dir() and (p / "__init__.py").exists()}  # fmt: skip
    assert folders | {"cli", "native"} == set(FOLDERS)


def test_the_documented_floors_are_the_folders() -> None:
    """docs/architecture.md's floor table names each folder on its floor."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("## Floors") :]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "|" in line[2:]]
    documented: dict[str, int] = {}
    for row in rows[1:]:  # the header first
        cells = [c.strip() for c in row.strip("|").split("|")]
        number = cells[0].split()[0]
        if not number.isdigit():
            break
        for folder in FOLDERS:
            if f"`pycxl/{folder}/`" in cells[1] or f"`{folder}/`" in cells[1]:
                documented[folder] = int(number)
    assert documented == FOLDERS


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
    assert {"pycxl.measure.targets", "pycxl.numa.launch", "pycxl.resolve.tiers"} <= found[
        "pycxl.resolve.system"
    ]
    assert "pycxl.cxl.regions" in found["pycxl.byname.facade"]
    assert "pycxl.numa.placement" in found["pycxl.gpu.memory"]  # inside a method
    # and it would catch the kind of import it exists for
    assert floor("pycxl.resolve.system") > floor("pycxl.numa.placement")


def test_names_are_parsed_on_the_resolver_floor_only() -> None:
    """tiers' name grammar is used from the resolver and above, never below."""
    for module, path, is_package in MODULES:
        if floor(module) < 2:
            assert "pycxl.resolve.tiers" not in imports(module, path, is_package), module
            assert "pycxl.resolve.system" not in imports(module, path, is_package), module


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
