#!/usr/bin/env bash
# Install everything the test suite needs on Debian 12 (as root): QEMU with CXL
# emulation and the 6.12 kernel from bookworm-backports, ndctl/daxctl (the oracle),
# numactl, udev (the guest borrows the host's udevd), Prometheus' node_exporter and
# promtool, Slurm and munge; pycxl and the Python test dependencies in a virtual
# environment, .venv (run the tests with .venv/bin/python -m pytest); then fetch the
# testbed kernel and check that nothing is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "setup-test-env.sh installs system packages: run it as root (sudo)" >&2
    exit 3
fi
if ! grep -qs 'bookworm' /etc/os-release; then
    echo "setup-test-env.sh supports Debian 12 (bookworm); install the equivalent packages" \
         "by hand: QEMU >= 8.0, ndctl/daxctl, numactl, kmod, and a 6.12 kernel image" >&2
    exit 4
fi

# bookworm-backports, derived from the machine's own Debian source entry.
src=/etc/apt/sources.list.d/debian.sources
bp=/etc/apt/sources.list.d/pycxl-backports.sources
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    if [ -f "$src" ]; then
        awk 'BEGIN { RS = ""; ORS = "\n\n" } /Suites:.*bookworm( |$)/ {
                 sub(/Suites:[^\n]*/, "Suites: bookworm-backports"); print; exit }' \
            "$src" > "$bp"
    else
        line=$(grep -h '^deb .* bookworm main' /etc/apt/sources.list | head -n1)
        echo "${line/ bookworm / bookworm-backports }" > /etc/apt/sources.list.d/pycxl-backports.list
    fi
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q -t bookworm-backports qemu-system-x86
# gcc builds the measurement loops (cffi) when pycxl is installed. udev: virtme-ng's
# guest runs the host's systemd-udevd for its device links and hotplug events. Debian's
# python3 with its headers and venv module: the tests install pycxl with it the README's
# way, and it makes .venv where it is the python3 on PATH.
apt-get install -y -q kmod ndctl daxctl libcxl1 libnuma1 numactl busybox-static udev \
    gcc libc6-dev iproute2 python3 python3-dev python3-venv
# The real exporter that reads pycxl's Prometheus textfiles in the tests (its service is
# not needed: the tests start their own on a free port); promtool (Debian's prometheus
# package) lints the textfiles and runs the shipped alerting rules' tests.
apt-get install -y -q --no-install-recommends prometheus-node-exporter prometheus
# A one-host Slurm cluster in the fleet tests: munge, slurmctld, slurmd and the clients.
# The tests run them as root with their own key, configuration, ports and state folder;
# the packages' own services are not needed.
apt-get install -y -q --no-install-recommends munge slurmctld slurmd slurm-client
# ShellCheck lints the shell scripts operators copy from contrib/.
apt-get install -y -q --no-install-recommends shellcheck
# lspci (pciutils): the oracle for the PCIe links and CXL capability pycxl list shows.
apt-get install -y -q --no-install-recommends pciutils

# The tests' Python: a virtual environment in the repository (the testbed's guest sees it
# through the shared file system), made by python3 on PATH or $PYTHON; a distribution's
# python3 is externally managed (PEP 668) and takes no pip install of its own. It sees no
# system site-packages: what the tests import is what pyproject.toml's test extras and the
# lines below install. Made again only when it runs on another interpreter.
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "setup-test-env.sh: pycxl needs Python 3.11 or later; $python is" \
         "$("$python" -V 2>&1). Name another with PYTHON=/path/to/python3" >&2
    exit 5
fi
# The measurement loops compile against the interpreter's headers.
if ! "$python" -c 'import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    echo "setup-test-env.sh: $python has no C headers (Python.h) to build pycxl with:" \
         "install its development files, or use PYTHON=/usr/bin/python3" >&2
    exit 5
fi
ident='import sys; print(sys.base_prefix, sys.version)'
if [ ! -x .venv/bin/python ] ||
        [ "$(.venv/bin/python -c "$ident" 2>/dev/null)" != "$("$python" -c "$ident")" ]; then
    "$python" -m venv --clear .venv
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${pip[@]}" -e '.[test]'
# PyTorch's CPU build, for the pinned-tensor example's CPU path in the testbed (pinned to
# the version whose CPU wheel this kind of machine keeps on disk)
"${pip[@]}" torch==2.13.0
.venv/bin/python -m pycxl.cli.main testbed --setup
