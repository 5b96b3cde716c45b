"""Run a pycxl command that writes a file, and stop it for good half-way through that
write: ``python -m tests.fleet.interrupted_writer POINT FD -- ARGS...``.

POINT is where the writer stops: ``mid-write`` (half of the new content written to the
file it writes), ``before-rename`` (all of it written and synced, not yet renamed into
place), or ``naive`` (what a writer without a temporary file would do: half of the new
content written over the file itself). When it gets there it writes one byte to FD
and waits to be killed. pycxl's code runs as it is; only the moment is chosen here.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

PREFIX = ".pycxl-"  # pycxl.base.outfiles' temporary files


def _stop_here(ready: int) -> None:
    os.write(ready, b"x")
    while True:
        signal.pause()


def main(argv: list[str]) -> int:
    point, ready, args = argv[0], int(argv[1]), argv[3:]
    assert argv[2] == "--"
    if point == "mid-write":
        real_fdopen = os.fdopen

        def fdopen(fd: int, *a: Any, **k: Any) -> Any:
            f = real_fdopen(fd, *a, **k)
            if not os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(PREFIX):
                return f

            class Half:
                def __enter__(self) -> Half:
                    return self

                def __exit__(self, *exc: object) -> None:
                    f.close()

                def write(self, data: bytes) -> int:
                    f.write(data[: len(data) // 2])
                    f.flush()
                    _stop_here(ready)
                    return 0

                def __getattr__(self, name: str) -> Any:
                    return getattr(f, name)

            return Half()

        os.fdopen = fdopen  # type: ignore[assignment]
    elif point == "before-rename":
        real_replace = os.replace

        def replace(src: Any, dst: Any, **k: Any) -> None:
            if os.path.basename(str(src)).startswith(PREFIX):
                _stop_here(ready)
            real_replace(src, dst, **k)

        os.replace = replace
    elif point == "naive":
        import pycxl.base.outfiles

        def write_in_place(path: str, data: str | bytes, mode: int = 0o644) -> None:
            raw = data.encode() if isinstance(data, str) else data
            with open(path, "wb") as f:
                f.write(raw[: len(raw) // 2])
                f.flush()
                _stop_here(ready)

        pycxl.base.outfiles.write_atomically = write_in_place  # type: ignore[assignment]
    else:
        raise SystemExit(f"unknown point {point!r}")
    from pycxl.cli.main import main as pycxl

    return pycxl(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
