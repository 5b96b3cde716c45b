"""Load a shared library through cffi's ABI mode, once, on first use."""

from __future__ import annotations

import threading
from typing import Any

from ..errors import LibraryNotFoundError


class SharedLibrary:
    """A library named by soname, with the declarations in ``native/<cdef_name>.h``."""

    def __init__(self, sonames: tuple[str, ...], cdef_name: str, package_hint: str) -> None:
        self.sonames = sonames
        self.cdef_name = cdef_name
        self.package_hint = package_hint
        self._lock = threading.Lock()
        self._loaded: tuple[Any, Any] | None = None
        self._error: LibraryNotFoundError | None = None

    def load(self) -> tuple[Any, Any]:
        """(ffi, lib); raises LibraryNotFoundError naming what to install."""
        if self._loaded is not None:
            return self._loaded
        with self._lock:
            if self._loaded is None:
                if self._error is not None:
                    raise self._error
                self._loaded = self._open()
        return self._loaded

    def available(self) -> bool:
        """Whether the library loads here (loads it if it can)."""
        try:
            self.load()
        except LibraryNotFoundError:
            return False
        return True

    def _open(self) -> tuple[Any, Any]:
        ffi = prebuilt_declarations(self.cdef_name)
        errors = []
        for soname in self.sonames:
            try:
                if ffi is None:
                    # Probe with a plain dlopen before parsing the declarations (tens of
                    # milliseconds) for a library that may well be absent.
                    import ctypes

                    ctypes.CDLL(soname)
                    ffi = parsed_declarations(self.cdef_name)
                return ffi, ffi.dlopen(soname)
            except OSError as e:
                errors.append(str(e))
        self._error = LibraryNotFoundError(self.sonames[0], self.package_hint, "; ".join(errors))
        raise self._error


def prebuilt_declarations(cdef_name: str) -> Any | None:
    """The FFI of ``native/<cdef_name>.h`` as parsed at install time (``pycxl._abi_<name>``,
    see native/build_abi.py), or None where it was not built."""
    import importlib

    try:
        return importlib.import_module(f"pycxl._abi_{cdef_name}").ffi
    except ImportError:
        return None


def parsed_declarations(cdef_name: str) -> Any:
    """The FFI of ``native/<cdef_name>.h``, parsed now."""
    import importlib

    try:
        import cffi
    except ImportError as e:  # pragma: no cover - cffi is a dependency
        raise LibraryNotFoundError("cffi", "the Python package cffi") from e
    # native/ installs as pycxl.native; imported by name so type checkers of the
    # source tree (where it sits at the top level) need not resolve it.
    native = importlib.import_module("pycxl.native")
    ffi = cffi.FFI()
    ffi.cdef(native.cdef(cdef_name))
    return ffi


def has_symbol(lib: Any, name: str) -> bool:
    """Whether an optional function declared in the cdef exists in the loaded library."""
    try:
        getattr(lib, name)
    except AttributeError:
        return False
    return True


def cstr(ffi: Any, ptr: Any) -> str | None:
    """A C string as str, or None for NULL."""
    if ptr == ffi.NULL:
        return None
    return str(ffi.string(ptr).decode("utf-8", "replace"))
