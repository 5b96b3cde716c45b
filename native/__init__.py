"""C declarations for the shared libraries pycxl binds (cffi ABI mode, dlopen at run time)."""

from __future__ import annotations

from importlib import resources


def cdef(name: str) -> str:
    """The declarations in ``<name>.h`` beside this file."""
    return resources.files(__name__).joinpath(f"{name}.h").read_text(encoding="utf-8")
