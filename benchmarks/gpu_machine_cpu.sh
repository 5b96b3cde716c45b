# CPU benchmarks on the GPU machine (16 cores, real DRAM): pycxl vs likwid-bench three
# times over, pycxl's latency runs, and the CLI's overhead. Expects the wheels pycxl
# needs in .whl/ and likwid-bench unpacked with its libraries under .ref/likwid/
# (Debian packages likwid, liblua5.3-0, libhwloc15).
set -e
bash benchmarks/gpu_machine_setup.sh
export PYTHONPATH=/tmp/site:/tmp/pkg
export LD_LIBRARY_PATH=$PWD/.ref/likwid/usr/lib/x86_64-linux-gnu
export PATH=$PWD/.ref/likwid/usr/bin:$PWD/.ref/likwid/usr/sbin:$PATH
lscpu | grep -E "Model name|^CPU\(s\)|L3|NUMA node\(s\)"
for round in 1 2 3; do
    python3 benchmarks/stream_vs_likwid.py --size 1200M
done
python3 benchmarks/stream_vs_likwid.py --size 1200M --threads 1
python3 benchmarks/latency_runs.py --size 1G --page-size 4k --runs 7
python3 benchmarks/latency_runs.py --size 1G --page-size 2m --runs 7
(cd /tmp && python3 "$OLDPWD/benchmarks/cli_overhead.py" --runs 5)
