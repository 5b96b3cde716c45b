#!/usr/bin/env bash
# Install everything the test suite needs on Debian 12 (as root): QEMU with CXL
# emulation and the 6.12 kernel from bookworm-backports, ndctl/daxctl (the oracle),
# numactl, udev (the guest borrows the host's udevd), Prometheus' node_exporter and
# promtool, Slurm and munge, and the Python test dependencies; then fetch the testbed
# kernel and check that nothing is missing.
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
# guest runs the host's systemd-udevd for its device links and hotplug events.
apt-get install -y -q kmod ndctl daxctl libcxl1 libnuma1 numactl busybox-static udev \
    gcc libc6-dev iproute2
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

# The measurement loops compile against the interpreter's headers; a distribution
# Python ships them separately.
if ! python3 -c 'import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    apt-get install -y -q python3-dev
fi
python3 -m pip install -q -e '.[test]'
# PyTorch's CPU build, for the pinned-tensor example's CPU path in the testbed (pinned to
# the version whose CPU wheel this kind of machine keeps on disk)
python3 -m pip install -q torch==2.13.0
python3 -m pycxl.cli.main testbed --setup
