# CPU benchmarks on the GPU machine (16 cores, real DRAM): pycxl vs likwid-bench three
# times over, pycxl's latency runs, and the CLI's overhead. Expects the wheels pycxl
# needs in .whl/ and likwid-bench unpacked with its libraries under .ref/likwid/
# (Debian packages likwid, liblua5.3-0, libhwloc15).
set -e
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
# pycxl as installed (pycxl.cli and pycxl.native come from cli/ and native/)
rm -rf /tmp/pkg && mkdir -p /tmp/pkg/pycxl
ln -s "$PWD"/pycxl/* /tmp/pkg/pycxl/ && ln -s "$PWD/cli" /tmp/pkg/pycxl/cli
ln -s "$PWD/native" /tmp/pkg/pycxl/native
export PYTHONPATH=/tmp/site:/tmp/pkg
(cd /tmp/pkg && python3 "$OLDPWD/native/build_bench.py" >/dev/null 2>&1)
(cd /tmp && python3 -c "import pycxl._bench")
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
