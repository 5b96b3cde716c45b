# On the GPU machine, after gpu_machine_check.sh installed pycxl: the figures the docs
# quote, in one run: start-up ratios (benchmarks/startup.py), layer streaming against
# accelerate's cpu_offload and the plain loops (three rounds), the ZeRO-Offload example
# before (--mode serial) and after, and bench offload with every GPU at once.
export PYTHONUNBUFFERED=1
R=$(cd "$(dirname "$0")/.." && pwd)
cd /tmp || exit 1
timeout 150 python3 "$R/benchmarks/startup.py" --runs "${RUNS:-15}"
timeout 300 python3 "$R/benchmarks/offload_vs_accelerate.py" --tier dram0 --rounds "${ROUNDS:-3}"
for mode in serial overlap; do
    timeout 90 python3 "$R/examples/zero_offload.py" --tier dram0 --layers 8 --width 4096 \
        --steps 10 --mode "$mode" | tail -2
done
timeout 90 pycxl bench offload --gpu all
