# On the GPU machine, from the source tree, after pycxl is installed as a user installs it
# (python3 -m pip install --no-index --find-links .whl .):
#     bash benchmarks/gpu_machine_startup.sh
# GPU enumeration without CUDA, checked and timed, in one run (at most about 8 minutes):
#   1. what NVML, the driver's files and the CUDA driver each say (gpu_facts.py);
#   2. startup ratios of list, list -G and check -q to a minimal click command (startup.py);
#   3. the enumeration tests (tests/gpu/test_gpu_devices.py, tests/unit/test_gpu_files.py)
#      against the installed package;
#   4. where list -G and check -q spend their time (import times, profiles);
#   5. the other GPU tests (benchmarks, pinning and transfers start CUDA by PCI address now);
# then a summary. Every step runs whatever the one before did; logs go to $OUT (/tmp/out).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SRC=$(cd "$(dirname "$0")/.." && pwd)
step() { printf '\n=== %s\n' "$*"; }

step "installed package"
cd /tmp || exit 1
python3 -c "import sys, pycxl; print('pycxl', pycxl.__version__, 'from', pycxl.__file__, 'python', sys.version.split()[0])"
python3 -c "import pycxl._abi_nvml, pycxl._abi_cuda; print('declarations parsed at install: yes')" \
    || echo "declarations parsed at install: MISSING (pycxl not installed from this tree?)"
command -v pycxl
nvidia-smi -L
nvidia-smi --query-gpu=driver_version,persistence_mode,memory.total --format=csv

step "what each source says (benchmarks/gpu_facts.py)"
timeout 90 python3 "$SRC/benchmarks/gpu_facts.py" 2>&1 | tee "$OUT/gpu_facts.log"

step "pycxl list -G, then with --cuda"
TIMEFORMAT="(%R s)"
for args in "list -G" "list -G --cuda" "list -G --json" "check -q"; do
    echo "\$ pycxl $args"
    time timeout 30 pycxl $args
    echo "rc=$?"
done 2>&1 | tee "$OUT/list.log"

step "startup ratios (benchmarks/startup.py)"
timeout 200 python3 "$SRC/benchmarks/startup.py" --runs 20 2>&1 | tee "$OUT/startup.log"

step "enumeration tests, against the installed package"
rm -rf /tmp/pkg && mkdir -p /tmp/pkg
cp -r "$SRC/tests" "$SRC/docs" "$SRC/examples" "$SRC/README.md" "$SRC/pyproject.toml" /tmp/pkg/
cd /tmp/pkg || exit 1
timeout 180 python3 -m pytest -q -p no:cacheprovider -ra tests/gpu/test_gpu_devices.py \
    tests/unit/test_gpu_files.py 2>&1 | tee "$OUT/enumeration-tests.log" | tail -40

step "where list -G and check -q spend their time"
cd /tmp || exit 1
python3 -X importtime -c "from pycxl.cli.main import main; main(['list', '-G'])" \
    2>"$OUT/importtime-list-G.txt" >/dev/null
echo "largest self import times of 'pycxl list -G' (us):"
sort -t'|' -k1.13 -n -r "$OUT/importtime-list-G.txt" | head -25
for args in "list -G" "check -q" "list -N"; do
    echo "profile of 'pycxl $args', by cumulative time:"
    prof="$OUT/profile-${args// /_}.txt"
    python3 - $args >"$prof" 2>&1 <<'EOF'
import cProfile, io, pstats, sys
argv = sys.argv[1:]
prof = cProfile.Profile()
prof.enable()
from pycxl.cli.main import main
with open("/dev/null", "w") as sink:
    stdout, sys.stdout = sys.stdout, sink
    try:
        main(argv)
    finally:
        sys.stdout = stdout
prof.disable()
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
print(s.getvalue())
EOF
    head -45 "$prof"
done

step "the other GPU tests"
cd /tmp/pkg || exit 1
# the benchmarks first: they reach their GPU by PCI address and read L2 and SMs from CUDA
timeout 150 python3 -m pytest -q -p no:cacheprovider -ra tests/gpu/test_gpu_bench.py tests/gpu \
    --ignore=tests/gpu/test_gpu_devices.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -30

step "summary"
grep -E "goal|click command|ratio" "$OUT/startup.log"
echo "enumeration tests: $(tail -1 "$OUT/enumeration-tests.log")"
echo "other GPU tests:   $(tail -1 "$OUT/gpu-tests.log")"
grep -E "read_gpus|nvmlInit|nvmlShutdown|memory v2|cuDeviceTotalMem" "$OUT/gpu_facts.log"
