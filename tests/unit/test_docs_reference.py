"""docs/cli.md says what the commands do: its synopsis lists exactly the options each
command has (commands read from the CLI's own table, so a new command or option without
docs fails here), and every key the commands print with --json is in its key tables.
docs/architecture.md's module table lists every module of pycxl/ and cli/, and no other."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from pycxl.cli.main import COMMANDS, cli

ROOT = Path(__file__).resolve().parents[2]
CLI_MD = (ROOT / "docs" / "cli.md").read_text()
TREE = ROOT / "tests" / "data" / "trees" / "two-dev"
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def synopsis() -> dict[str, set[str]]:
    """Command path ('pycxl bench latency') -> the options its synopsis line names."""
    block = CLI_MD.split("## Synopsis", 1)[1].split("```", 2)[1]
    out: dict[str, set[str]] = {}
    current = ""
    for line in block.splitlines():
        if line.startswith("pycxl"):
            words = line.split()
            path = ["pycxl"]
            for w in words[1:]:
                if not re.fullmatch(r"[a-z][a-z-]*", w):
                    break
                path.append(w)
            current = " ".join(path)
            out[current] = set()
        if current:
            out[current] |= set(_OPTION.findall(line.replace("[--]", "")))
    return out


def click_commands() -> dict[str, set[str]]:
    """Command path -> its visible options, from the commands themselves."""
    ctx = click.Context(cli)
    out: dict[str, set[str]] = {}

    def options(cmd: click.Command) -> set[str]:
        return {o for p in cmd.params if isinstance(p, click.Option) and not p.hidden
                for o in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}  # fmt: skip

    def walk(cmd: click.Command, path: str) -> None:
        if isinstance(cmd, click.Group) and path != "pycxl":
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(sub, f"{path} {name}")
            return
        out[path] = options(cmd)

    for name in COMMANDS:
        cmd = cli.get_command(ctx, name)
        assert cmd is not None
        walk(cmd, f"pycxl {name}")
    out["pycxl"] = options(cli)
    return out


def test_the_synopsis_lists_every_command_and_option_and_no_other() -> None:
    documented, actual = synopsis(), click_commands()
    assert sorted(documented) == sorted(actual)
    for path, opts in actual.items():
        shown = documented[path] | {"-h", "--help"}
        assert shown == opts, f"{path}: docs only {shown - opts}; command only {opts - shown}"


# --- JSON keys ---------------------------------------------------------------------------
def documented_keys() -> set[str]:
    """Every key the key tables of docs/cli.md name (backquoted words in their rows)."""
    tables = CLI_MD.split("The keys:", 1)[1].split("### Tier names", 1)[0]
    rows = [line for line in tables.splitlines() if line.startswith("|")]
    return {w for row in rows for w in re.findall(r"`([^`]+)`", row)}


# keys whose values are maps of data (node ids, counter and label names), not fields; and
# ndctl's health and alert_config objects, documented in operations.md
MAPS = {"distances", "moved_to", "labels", "totals", "rates_per_s", "memory_tiers",
        "interleave_weights", "fields", "health", "alert_config"}  # fmt: skip


def keys(doc: Any, out: set[str] | None = None) -> set[str]:
    out = set() if out is None else out
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.add(k)
            if k not in MAPS:
                keys(v, out)
    elif isinstance(doc, list):
        for v in doc:
            keys(v, out)
    return out


def run_json(*args: str) -> Any:
    env = {**os.environ, "PYCXL_BENCH_QUICK": "1"}
    p = subprocess.run([sys.executable, "-m", "pycxl.cli.main", *args, "--json"], env=env,
                       capture_output=True, text=True, check=False, timeout=300)  # fmt: skip
    assert p.returncode in (0, 4, 6, 7), f"{args}: {p.stderr}"
    return json.loads(p.stdout)


COMMAND_LINES = [
    ["list", "--sysroot", str(TREE / "region")],
    ["list", "-BPEMDRXNG", "-T", "-i", "--sysroot", str(TREE / "region")],
    ["list", "-vvv", "--sysroot", str(TREE / "region")],
    ["list", "-M", "-H", "-A", "-L", "--sysroot", str(TREE / "region")],
    ["numa"],
    ["numa", "--sysroot", str(TREE / "region")],
    ["where", str(os.getpid())],
    ["pin-probe", "dram0"],
    ["region", "create", "--dry-run", "--sysroot", str(TREE / "fresh")],
    ["region", "destroy", "region0", "--dry-run", "--sysroot", str(TREE / "region")],
    ["check", "--events", "", "--sysroot", str(TREE / "region")],
    ["check", "--events", "", "--sysroot", str(TREE / "fresh")],
    ["stat", "--sysroot", str(TREE / "region")],
    ["top", "--once", "-d", "0.2", "-p", str(os.getpid())],
    ["list", "-G", "--sysroot", str(TREE.parents[1] / "gpu" / "h200")],
    ["bench", "latency", "-t", "dram0", "--size", "64K", "-n", "1"],
    ["bench", "bandwidth", "-t", "dram0", "--size", "64K", "-n", "1", "--kernel", "copy"],
    ["bench", "bandwidth", "-t", "dram0", "--mix", "read", "-n", "1"],
    ["bench", "first-touch", "-t", "dram0", "--size", "1M"],
    # points from the load's own peak (--steps): a rate in GB/s may be above what a busy
    # machine's load reaches, which is refused
    ["bench", "loaded-latency", "-t", "dram0", "--steps", "2", "--duration", "0.05",
     "--load-threads", "1"],
    ["bench", "matrix", "--no-gpus", "--size", "64K"],
]  # fmt: skip


@pytest.mark.parametrize("args", COMMAND_LINES, ids=" ".join)
def test_every_json_key_is_in_the_key_tables(args: list[str]) -> None:
    printed = keys(run_json(*args))
    missing = printed - documented_keys()
    assert not missing, f"pycxl {' '.join(args)} --json prints keys docs/cli.md lacks: {missing}"


# --- docs/architecture.md ----------------------------------------------------------------
def architecture_modules() -> set[str]:
    """The module paths the module table of docs/architecture.md names (its first column)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Modules", 1)[1].split("\n## ", 1)[0]
    return {m for line in table.splitlines() for m in re.findall(r"^\| `([^`]+\.py)` \|", line)}


def package_modules() -> set[str]:
    """Every module under pycxl/ and cli/, less those made at install time (_abi_*)."""
    return {p.relative_to(ROOT).as_posix() for top in ("pycxl", "cli")
            for p in (ROOT / top).rglob("*.py")
            if "__pycache__" not in p.parts and not p.name.startswith("_abi_")}  # fmt: skip


def test_the_architecture_module_table_lists_every_module_and_no_other() -> None:
    listed, actual = architecture_modules(), package_modules()
    assert actual, "no modules found"
    assert not actual - listed, f"docs/architecture.md lacks modules: {sorted(actual - listed)}"
    assert not listed - actual, f"docs/architecture.md names no module: {sorted(listed - actual)}"
