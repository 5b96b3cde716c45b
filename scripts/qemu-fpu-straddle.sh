#!/bin/sh
# Does the testbed's QEMU survive FPU-state saves across a DRAM page and a CXL page
# above it? Run on the host: sh scripts/qemu-fpu-straddle.sh  (docs/testbed.md)
# Prints "QEMU survives" (exit 0) or "QEMU crashed" (exit 1). The controls (the same
# saves with both pages on one node, or CXL below DRAM) run first and must survive.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${PYCXL_TESTBED_WORKDIR:-}" ]; then
    bin=$(mktemp -d)/qemu_fpu_straddle
    gcc -O1 -static -o "$bin" "$here/qemu_fpu_straddle.c"
    rc=0
    pycxl testbed -- sh "$here/qemu-fpu-straddle.sh" "$bin" || rc=$?
    rm -rf "$(dirname "$bin")"
    exit $rc
fi
bin=$1  # in the guest: one try per run (a crash boots the guest again; say so instead)
mark=$PYCXL_TESTBED_WORKDIR/fpu-straddle-started
if [ -e "$mark" ]; then
    echo "QEMU crashed: the saves across DRAM (below) and CXL (above) stopped the emulator"
    exit 1
fi
touch "$mark"
cxl=$(pycxl region create --zone movable --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["numa_node"])')
for kind in xsave signal; do
    "$bin" 0 0 $kind
    "$bin" "$cxl" 0 $kind
    "$bin" "$cxl" "$cxl" $kind
done
"$bin" 0 "$cxl" xsave
"$bin" 0 "$cxl" signal
echo "QEMU survives FPU-state saves across DRAM and CXL pages"
