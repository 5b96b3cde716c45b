#!/bin/sh
# Does the testbed's QEMU survive FPU-state saves across a DRAM page and a CXL page
# above it? Run on the host: sh scripts/qemu-fpu-straddle.sh  (docs/testbed.md)
# Prints "QEMU survives" (exit 0) or "QEMU crashed" (exit 1), naming each save (a user
# FXSAVE, a signal frame) that stopped the emulator. The controls (the same saves with
# both pages on one node, or CXL below DRAM) run first in each boot and must survive.
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
bin=$1  # in the guest (booted again after each crash, up to three boots)
cxl=$(pycxl region create --zone movable --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["numa_node"])')
for kind in xsave signal; do
    "$bin" 0 0 $kind
    "$bin" "$cxl" 0 $kind
    "$bin" "$cxl" "$cxl" $kind
done
# each straddle is tried once; a mark left by an earlier boot means it stopped the emulator
crashed=0
for kind in xsave signal; do
    mark=$PYCXL_TESTBED_WORKDIR/straddle-$kind
    if [ -e "$mark" ]; then
        echo "$kind: the emulator stopped (DRAM below, CXL above)"
        crashed=1
        continue
    fi
    touch "$mark"
    "$bin" 0 "$cxl" $kind
done
if [ $crashed = 1 ]; then
    echo "QEMU crashed: FPU-state saves across DRAM (below) and CXL (above) stop the emulator"
    exit 1
fi
echo "QEMU survives FPU-state saves across DRAM and CXL pages"
