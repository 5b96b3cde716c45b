"""cffi build script for the declarations of the libraries bound in ABI mode, parsed once at
install time: ``pycxl._abi_<name>`` holds ``native/<name>.h`` as cffi's out-of-line ABI
module (pure Python, no compiler), so loading a library at run time skips the C parser
(tens of milliseconds: ``pycxl list`` reads GPUs through NVML at every start).

Without the module (a source tree that was not built), the loader parses the header
itself, as before: same declarations, slower.
"""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
PREBUILT = ("nvml", "cuda")  # the libraries whose start-up cost users see


def builder(name: str) -> FFI:
    """The out-of-line ABI builder of ``native/<name>.h`` as ``pycxl._abi_<name>``."""
    ffi = FFI()
    ffi.cdef((HERE / f"{name}.h").read_text(encoding="utf-8"))
    ffi.set_source(f"pycxl._abi_{name}", None)
    return ffi


nvml = builder("nvml")
cuda = builder("cuda")

if __name__ == "__main__":
    for b in (nvml, cuda):
        b.compile(verbose=True)
