"""pycxl's CLI run as user 'nobody', for the checks that must work (or fail by name)
without root. What the command imports is imported as root first: the interpreter's own
files may be root's alone."""

from __future__ import annotations

import subprocess
import sys

PRELOAD = (
    "import os, sys, logging, traceback, json, difflib, subprocess\n"
    "import pycxl.cli.main, pycxl.cli.numa_cmd, pycxl.cli.render\n"
    "import pycxl.numa.pages, pycxl.numa.nodes, pycxl.numa.policy\n"
    "import pycxl.resolve.system, pycxl.base.plan, pycxl.byname.tuning\n"
    "import pycxl.cxl.sysfs_backend, pycxl.gpu.devices\n"
)


def as_nobody(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``pycxl ARGV`` with the user and groups of nobody."""
    code = (
        PRELOAD + "os.setgroups([]); os.setresgid(65534, 65534, 65534); "
        "os.setresuid(65534, 65534, 65534)\n"
        "sys.exit(pycxl.cli.main.main(sys.argv[1:]))\n"
    )
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          check=False, timeout=60)  # fmt: skip
