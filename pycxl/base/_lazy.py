"""Names a package exports but imports only when first used (so ``import pycxl`` and each
command load only what they need), still listed by dir() and help()."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any


def lazy_exports(
    package: str, names: dict[str, str], exported: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps each lazily loaded
    name to its submodule (relative, e.g. 'cxl.regions'; one more leading dot for a
    module beside the package, '.measure.results'); a name mapped to '' is the
    submodule of that name itself."""
    listed = sorted(set(exported) | set(names))

    def getattr_(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if module == "":
            return importlib.import_module(f".{name}", package)
        return getattr(importlib.import_module(f".{module}", package), name)

    def dir_() -> list[str]:
        return listed

    return getattr_, dir_
