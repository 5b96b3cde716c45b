# The commands of docs/regions.md, in order; run in the testbed to refresh its output:
#   pycxl testbed -t two-dev -- sh scripts/guide_regions.sh
set -e
run() { echo "\$ $*"; "$@"; echo; }
run pycxl list -M
run pycxl region create --interleave 2 --dry-run
run pycxl region create --interleave 2
run pycxl numa
run pycxl list -R -X
run pycxl run --membind cxl0 -- grep -m1 anon= /proc/self/numa_maps
run pycxl region destroy region0
run pycxl region create 0x1 0x2 --size 1G || true
