# On the GPU machine (after gpu_machine_setup.sh installed pycxl from .whl/): DeepSpeed
# from the wheel built on a machine with PyPI (DS_BUILD_OPS=0 pip wheel --no-deps
# --no-build-isolation deepspeed==0.19.8) and its dependencies carried in .whl/, the
# training offload's GPU tests, then the comparison with DeepSpeed (ONLY: configurations).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --find-links .whl deepspeed 2>&1 | grep -v "Running pip as the 'root' user"
cd /tmp/pkg || exit 1
R="$OLDPWD"
if [ -z "${SKIP_TESTS:-}" ]; then
    python3 -m pytest -q -x tests/gpu/test_gpu_model_offload.py tests/gpu/test_gpu_offload.py || exit 1
fi
# shellcheck disable=SC2086
python3 "$R/benchmarks/train_offload_vs_deepspeed.py" --tier dram0 ${ONLY:+--only $ONLY} ${BENCH_ARGS:-}
