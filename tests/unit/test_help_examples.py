"""The examples in every command's --help are command lines that work: none is a usage
error. Commands that read their own command line further than click does (``run`` and
``spill``: what follows is the program's) run here, where they end at once (no such
target, no CUDA driver, no such program); the others are parsed by the command itself."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
from pycxl.cli import exit_codes
from pycxl.cli.main import cli

from tests.unit.test_fuzz import command, commands

RUN_HERE = {("run",), ("spill",)}


def examples() -> list[tuple[tuple[str, ...], list[str]]]:
    """(command path, the example's words after it) for each example line in a help."""
    out = []
    for path in commands():
        cmd = command(path)
        text = cmd.help or ""
        for line in text.splitlines():
            found = re.match(r"\s+(pycxl\s+\S.*?)(?:\s{2,}\(.*)?$", line)
            if not found:
                continue
            words = shlex.split(found.group(1))[1:]
            if tuple(words[: len(path)]) == path:
                out.append((path, words[len(path) :]))
    return out


def test_the_helps_have_examples() -> None:
    assert {p for p, _ in examples()} >= {("run",), ("spill",), ("top",)}


@pytest.mark.parametrize("path,words", examples(), ids=lambda v: " ".join(v))
def test_an_example_in_a_help_is_not_a_usage_error(path: tuple[str, ...], words: list[str],
                                                   tmp_path: Path) -> None:  # fmt: skip
    if path in RUN_HERE:
        for script in [w for w in words if w.endswith(".py")]:  # the example's placeholder
            (tmp_path / script).write_text("")
        p = subprocess.run([sys.executable, "-m", "pycxl.cli.main", *path, *words],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           check=False)  # fmt: skip
        assert p.returncode != exit_codes.USAGE, (p.returncode, p.stderr)
        return
    ctx = click.Context(cli)
    with ctx:
        command(path).make_context(path[-1], list(words), parent=ctx)  # raises on a bad one
