# CPU benchmarks on the GPU machine (16 cores, real DRAM): pycxl vs likwid-bench in five
# alternating rounds, pycxl vs multichase side by side (4 KiB pages and THP), and the CLI's
# overhead. Expects the wheels pycxl needs in .whl/, likwid-bench unpacked with its
# libraries under .ref/likwid/ (Debian packages likwid, liblua5.3-0, libhwloc15), and
# multichase's sources in .ref/multichase/.
set -e
bash benchmarks/gpu_machine_setup.sh

export LD_LIBRARY_PATH=$PWD/.ref/likwid/usr/lib/x86_64-linux-gnu
export PATH=$PWD/.ref/likwid/usr/bin:$PWD/.ref/likwid/usr/sbin:$PATH
lscpu | grep -E "Model name|^CPU\(s\)|L3|NUMA node\(s\)"
(cd .ref/multichase && perl gen_expand 200 > expand.h &&
 gcc -std=gnu99 -O3 -fomit-frame-pointer -fno-unroll-loops -pthread -o /tmp/multichase \
     multichase.c permutation.c arena.c util.c -lrt -lm)
python3 benchmarks/latency_vs_multichase.py --multichase /tmp/multichase --size 1G --page-size 4k --rounds 5
python3 benchmarks/latency_vs_multichase.py --multichase /tmp/multichase --size 1G --page-size 2m --rounds 5
(cd /tmp && python3 "$OLDPWD/benchmarks/cli_overhead.py" --runs 5)
python3 benchmarks/stream_vs_likwid.py --size 1200M --rounds 5
