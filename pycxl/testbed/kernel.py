"""What the testbed needs on the host: QEMU with CXL emulation, virtme-ng, a kernel.

The kernel is Debian's 6.12 image (CXL region and dax drivers built as modules). It is
unpacked into a cache directory, never installed as the host's kernel.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..base.errors import TestbedError

MIN_QEMU = (8, 0)  # first QEMU with CXL type-3 volatile memory emulation
KERNEL_PACKAGE_RE = r"^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$"
INSTALL_HINT = (
    "apt-get install -t bookworm-backports qemu-system-x86 && "
    "apt-get install kmod busybox-static udev ndctl daxctl numactl && "
    "pip install 'pycxl[testbed]' (or: bash scripts/setup-test-env.sh)"
)
# virtme-init starts the host's udevd in the guest, found at these paths
UDEVD_PATHS = ("/usr/lib/systemd/systemd-udevd", "/lib/systemd/systemd-udevd")
BUSYBOX_NAMES = ("busybox-static", "busybox.static", "busybox")


@dataclass(frozen=True)
class Kernel:
    image: Path  # boot/vmlinuz-<version> inside the unpacked package
    version: str


def cache_dir() -> Path:
    """Where the testbed keeps its kernel and runs (PYCXL_TESTBED_CACHE moves it)."""
    env = os.environ.get("PYCXL_TESTBED_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pycxl" / "testbed"


def missing_requirements() -> list[str]:
    """What the testbed cannot boot without, in words; empty when it can boot."""
    missing = []
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        missing.append("qemu-system-x86_64 (Debian: qemu-system-x86 from bookworm-backports)")
    else:
        ver = qemu_version(qemu)
        if ver is not None and ver < MIN_QEMU:
            have = ".".join(map(str, ver))
            missing.append(
                f"QEMU >= 8.0 for CXL volatile memory (found {have}; "
                "install qemu-system-x86 from bookworm-backports)"
            )
    if vng_command() is None:
        missing.append("virtme-ng (pip install virtme-ng)")
    if shutil.which("depmod") is None and not os.path.exists("/sbin/depmod"):
        missing.append("depmod (Debian: kmod)")
    if not any(shutil.which(n) for n in BUSYBOX_NAMES):
        missing.append("busybox, for the guest's initramfs (Debian: busybox-static)")
    return missing


def missing_recommended() -> list[str]:
    """What the testbed boots without, but works less well without, in words."""
    if any(os.access(p, os.X_OK) for p in UDEVD_PATHS):
        return []
    return [
        "systemd-udevd (Debian: udev): the guest borrows the host's udevd for its device "
        "links (virtme-ng's script I/O ports) and its hotplug events; without it the "
        "command's output and status still come back through the work directory"
    ]


def qemu_version(binary: str) -> tuple[int, int] | None:
    """(major, minor) of a QEMU binary, or None."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    m = re.search(r"version (\d+)\.(\d+)", out.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def vng_command() -> str | None:
    """The virtme-ng command beside this interpreter, or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "vng")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("vng")


def find_kernel(root: Path | None = None) -> Kernel | None:
    """The unpacked testbed kernel, if it is ready."""
    root = root or cache_dir()
    images = sorted(glob.glob(str(root / "kernel" / "boot" / "vmlinuz-6.12*")))
    if not images:
        return None
    image = Path(images[-1])
    version = image.name.removeprefix("vmlinuz-")
    if not (root / "kernel" / "lib" / "modules" / version / "modules.dep").exists():
        return None
    return Kernel(image=image, version=version)


def prepare_kernel(root: Path | None = None) -> Kernel:
    """Return the cached kernel, fetching and unpacking Debian's package when absent."""
    root = root or cache_dir()
    found = find_kernel(root)
    if found:
        return found
    pkg = _newest_kernel_package()
    download = root / "download"
    download.mkdir(parents=True, exist_ok=True)
    _run(["apt-get", "download", pkg], cwd=download, what=f"downloading {pkg}")
    debs = sorted(download.glob(f"{pkg}_*.deb"))
    if not debs:
        raise TestbedError(f"apt-get download {pkg} left no .deb in {download}")
    target = root / "kernel"
    shutil.rmtree(target, ignore_errors=True)
    _run(["dpkg-deb", "-x", str(debs[-1]), str(target)], what="unpacking the kernel package")
    for vdir in (target / "lib" / "modules").iterdir():
        _run(["depmod", "-b", str(target), vdir.name], what="indexing kernel modules")
    for deb in debs:
        deb.unlink()
    kernel = find_kernel(root)
    if kernel is None:
        raise TestbedError(f"unpacked {pkg} into {target} but found no kernel image in it")
    return kernel


def _newest_kernel_package() -> str:
    try:
        out = subprocess.run(
            ["apt-cache", "search", "--names-only", KERNEL_PACKAGE_RE],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    except OSError as e:
        raise TestbedError(f"apt-cache is not available ({e}); the testbed needs Debian") from e
    names = [line.split(" ", 1)[0] for line in out.splitlines() if line.strip()]
    if not names:
        raise TestbedError(
            "no linux-image-6.12.*-amd64-unsigned package is known to apt; enable "
            "bookworm-backports and run 'apt-get update'"
        )
    return max(names, key=lambda n: [int(x) for x in re.findall(r"\d+", n)])


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as e:
        raise TestbedError(f"{what}: cannot run {cmd[0]} ({e})") from e
    if p.returncode != 0:
        raise TestbedError(f"{what} failed: {' '.join(cmd)}: {p.stderr.strip()[-500:]}")
