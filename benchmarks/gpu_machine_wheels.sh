#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the wheels an offline GPU machine (x86-64, Python 3.12,
# PyTorch already there) needs to install pycxl and run the DeepSpeed comparisons, into
# .whl/ (what gpu_machine_setup.sh installs from): pycxl's own dependencies that such an
# image lacks, the build tools, and DeepSpeed 0.19.8 built without its ops, with the
# packages it needs beyond PyTorch's.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl \
    cffi pycparser pyudev setuptools wheel typing-extensions \
    pydantic pydantic-core annotated-types typing-inspection hjson
if ! ls .whl/deepspeed-0.19.8-*.whl >/dev/null 2>&1; then
    venv=$(mktemp -d)
    trap 'rm -rf "$venv"' EXIT  # a failed or interrupted build leaves no venv behind
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q wheel setuptools
    DS_BUILD_OPS=0 "$venv/bin/pip" wheel -q --no-deps --no-build-isolation deepspeed==0.19.8 -w .whl
fi
ls .whl
