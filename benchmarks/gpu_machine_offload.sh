# On the GPU machine (after gpu_machine_setup.sh installed pycxl from .whl/): layer
# streaming's GPU tests, pycxl against accelerate's cpu_offload and the baselines (three
# rounds), `pycxl bench offload` with its defaults, and the ZeRO-Offload example before
# (--mode serial) and after (the adapter), in one run.
export PYTHONUNBUFFERED=1
cd /tmp/pkg || exit 1
R="$OLDPWD"
python3 -m pytest -q -x tests/gpu/test_gpu_offload.py || exit 1
pycxl bench offload
pycxl bench offload --backward --tokens 16384
python3 "$R/benchmarks/offload_vs_accelerate.py" --tier dram0 --rounds "${ROUNDS:-3}"
for mode in serial overlap; do
    python3 "$R/examples/zero_offload.py" --tier dram0 --layers 8 --width 4096 --steps 10 \
        --mode "$mode" | tail -2
done
