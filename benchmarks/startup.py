"""How long pycxl's quick commands take, as ratios to a minimal click command in the same
Python, in one run.

    python3 benchmarks/startup.py [--runs 20]

Runs a one-option click command (``python -c``, this interpreter: the least a click CLI
costs here) and each pycxl command through the installed console script alternately, so
machine noise hits both alike, and prints each median (wall and CPU time) and its ratio
to the click command's.
Goal: ``pycxl list``, ``pycxl list -G`` and ``pycxl check -q`` each at most 1.5 times the
click command (they run at the top of job scripts on every node). The bare interpreter
start is shown for scale. Bytecode caches are used as an installed package uses them
(PYTHONDONTWRITEBYTECODE is dropped for the commands).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TREE = Path(__file__).resolve().parents[1] / "tests" / "data" / "trees" / "two-dev" / "region"
GOAL = 1.5
CLICK = """\
import click
@click.command()
@click.option("--json", "as_json", is_flag=True)
def main(as_json):
    click.echo("ok")
main()
"""


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run; CPU time (user + system) is what a busy machine
    distorts least."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, _, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = 0  # reaped above
    return wall, usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # the console script of this interpreter's environment (not a wrapper found on PATH)
    beside = Path(sys.executable).parent / "pycxl"
    pycxl = str(beside) if beside.exists() else shutil.which("pycxl") or "pycxl"
    bare = [sys.executable, "-c", "pass"]
    click = [sys.executable, "-c", CLICK]
    goals = {
        "pycxl list": [pycxl, "list"],
        "pycxl list -G": [pycxl, "list", "-G"],
        "pycxl check -q": [pycxl, "check", "-q"],
    }
    others = {
        "pycxl list --json": [pycxl, "list", "--json"],
        "pycxl list (recorded CXL tree)": [pycxl, "list", "--sysroot", str(TREE)],
        "pycxl check (recorded CXL tree)": [pycxl, "check", "--sysroot", str(TREE)],
        "pycxl --help": [pycxl, "--help"],
    }
    commands = {"python -c pass": bare, "click command": click, **goals, **others}
    for name, cmd in commands.items():  # warm the page cache, write bytecode caches
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if p.returncode not in (0, 4):  # 4: check's "no CXL memory here"
            last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
            print(f"warning: {name} exits {p.returncode}: {last}")
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, cmd in commands.items():
            w, c = timed(cmd, env)
            wall[name].append(w)
            cpu[name].append(c)
    load = os.getloadavg()[0]
    print(f"{pycxl} (interpreter {sys.executable}), medians of {args.runs} runs, "
          f"load average {load:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'':32} {'wall':>9} {'ratio':>6} {'CPU':>9} {'ratio':>6}")
    base, cbase = statistics.median(wall["click command"]), statistics.median(cpu["click command"])
    worst = worst_cpu = 0.0
    for name in commands:
        m, c = statistics.median(wall[name]), statistics.median(cpu[name])
        goal = ""
        if name in goals:
            worst, worst_cpu = max(worst, m / base), max(worst_cpu, c / cbase)
            goal = f"  (goal <= {GOAL:g}x)"
        row = f"{m * 1e3:6.1f} ms {m / base:5.2f}x {c * 1e3:6.1f} ms {c / cbase:5.2f}x"
        print(f"{name:32} {row}{goal}")
    print(f"worst goal ratio to the click command: wall {worst:.2f}x, CPU {worst_cpu:.2f}x "
          f"(goal <= {GOAL:g}x)")  # fmt: skip
    return 0 if worst <= GOAL else 1


if __name__ == "__main__":
    raise SystemExit(main())
