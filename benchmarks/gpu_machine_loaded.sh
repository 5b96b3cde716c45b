# On the GPU machine: install pycxl as a user does, run pycxl bench loaded-latency with
# its defaults (and bench bandwidth --mix, matrix --loaded), then the goals script.
# Logs and JSON go to $OUT (or /tmp/out). Carry .whl (see gpu_machine_setup.sh).
export PYTHONUNBUFFERED=1
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
bash benchmarks/gpu_machine_setup.sh 2>&1 | tee "$OUT/setup.log" || exit 1
cp benchmarks/loaded_latency_goals.py /tmp/pkg/
cd /tmp || exit 1
nproc; lscpu | grep -E "Model name|Thread|Core|Socket|L3" | tee "$OUT/cpu.txt"
for c in "bench loaded-latency --target dram0" "bench bandwidth --target dram0 --mix all"; do
    echo "== pycxl $c"
    timeout 120 pycxl $c
    echo "rc=$?"
done 2>&1 | tee "$OUT/loaded-defaults.log"
timeout 400 python3 /tmp/pkg/loaded_latency_goals.py dram0 --gpu gpu0 --out "$OUT/loaded.json" \
    2>&1 | tee "$OUT/loaded-goals.log"
