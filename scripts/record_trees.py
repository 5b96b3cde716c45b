"""Re-record the sysfs trees under tests/data/trees from the real-kernel testbed.

    python3 scripts/record_trees.py [TOPOLOGY...]

For each topology: boot, record the fresh state with ndctl's JSON beside it; on
two-dev also create and online a 2-way region (pycxl region create) and record again; on
two-socket, a region on each socket (2-way on socket 0's bridge, 1-way on socket 1's);
on pmem-dev, the fresh devices with persistent capacity and label areas.
Hand-broken trees are made by the tests from copies of these; never edit them here.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pycxl.testbed import run_in_guest

REPO = Path(__file__).resolve().parents[1]
TREES = REPO / "tests" / "data" / "trees"
PY = sys.executable

RECORD = """
set -e
W=$PYCXL_TESTBED_WORKDIR
rec() {{
  {py} {repo}/scripts/record_sysfs.py $W/$1
  mkdir -p $W/$1/ndctl
  cxl list -M > $W/$1/ndctl/M.json
  cxl list -D {dflag} > $W/$1/ndctl/D.json
  cxl list -BPET -vvv -i > $W/$1/ndctl/all.json
}}
rec fresh
"""
REGION = """
{py} -m pycxl.cli.main region create --interleave 2 0x1 0x2
rec region
cxl list -R -T > $W/region/ndctl/RT.json
daxctl list > $W/region/ndctl/dax.json
"""

REGIONS = """
{py} -m pycxl.cli.main region create -d decoder0.0 0x11 0x12
{py} -m pycxl.cli.main region create -d decoder0.1 0x21
rec regions
cxl list -R -T > $W/regions/ndctl/RT.json
daxctl list > $W/regions/ndctl/dax.json
"""

# topology -> (cxl list -D flags, the script after the fresh state, the states recorded)
PLANS = {
    "two-dev": ("", REGION, ("fresh", "region")),
    "four-dev": ("-i", "", ("fresh",)),
    "two-socket": ("-i", REGIONS, ("fresh", "regions")),
    "pmem-dev": ("", "", ("fresh",)),
}


def main(argv: list[str]) -> int:
    unknown = [t for t in argv if t not in PLANS]
    if unknown:
        print(f"unknown topology {unknown[0]}; known: {', '.join(PLANS)}", file=sys.stderr)
        return 2
    for topo, (dflag, then, states) in PLANS.items():
        if argv and topo not in argv:
            continue
        script = RECORD.format(py=PY, dflag=dflag, repo=REPO) + then.format(py=PY)
        result = run_in_guest(script, topo, on_output=sys.stdout.write)
        if result.returncode:
            print(f"{topo}: recording failed ({result.returncode})", file=sys.stderr)
            return 1
        for state in states:
            dest = TREES / topo / state
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(result.workdir / state, dest, symlinks=True)
            print(f"recorded {dest.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
