"""The commands and library examples of README.md and docs/*.md, as users type them.

A fenced block's runnable lines are those that start with ``$ `` (shell commands, run
with ``sh -c``) or ``>>> `` / ``... `` (Python, run in one fresh interpreter per block).
Lines after a command, up to the next ``$``, are the output the docs show: their shape
(table headers, JSON keys) is checked against the real output.

An HTML comment right before a block says where it runs (default: this host):

    <!-- smoke: host -->           this machine, as it is
    <!-- smoke: testbed two-dev --> inside the real-kernel testbed (CXL), in doc order
    <!-- smoke: gpu -->             where a CUDA driver and a GPU are present
    <!-- smoke: nogpu -->           this host, if it has no CUDA driver (the absent path)
    <!-- smoke: nocxl -->           this host, if it has no CXL bus (the absent path)
    <!-- smoke: harness -->         this host, where the testbed can boot
    <!-- smoke: exit N -->          expected exit status N (default 0), on this host;
                                    'exit N' may follow testbed or gpu too
    <!-- smoke: skip REASON -->     not run (the reason is required)

``$ pycxl testbed [-t TOPOLOGY] -- COMMAND`` lines run COMMAND inside that topology's
guest (one boot for all of them); tests/testbed covers the harness itself.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_MARK = re.compile(r"<!--\s*smoke:\s*(\w+)\s*([^>]*?)\s*-->")
_TESTBED = re.compile(r"^pycxl testbed(?:\s+-t\s+(\S+)|\s+--topology\s+(\S+))?\s+--\s+(.+)$")
_DASHES = re.compile(r"^-+(?:\s{2,}-+)*\s*$")


@dataclass
class Example:
    """One runnable line (a shell command) or block (Python) of the docs."""

    doc: str  # file name, e.g. 'regions.md'
    line: int  # where it starts
    kind: str  # 'shell' or 'python'
    text: str  # the command, or the Python source
    where: str = "host"  # host, testbed, gpu
    topology: str = "two-dev"
    exit: int = 0
    shown: list[str] = field(default_factory=list)  # output lines the docs show

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def examples(paths: list[Path] | None = None) -> Iterator[Example]:
    for path in paths or DOCS:
        yield from _in_doc(path)


def _in_doc(path: Path) -> Iterator[Example]:
    lines = path.read_text().splitlines()
    mark: tuple[str, str] | None = None
    i = 0
    while i < len(lines):
        m = _MARK.search(lines[i])
        if m:
            mark = (m.group(1), m.group(2))
            i += 1
            continue
        if lines[i].lstrip().startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith("```"))
            block = lines[i + 1 : end]
            if mark and mark[0] == "skip":
                if not mark[1]:
                    raise ValueError(f"{path.name}:{i + 1}: 'smoke: skip' needs a reason")
            else:
                yield from _in_block(path.name, i + 2, block, mark)
            mark = None
            i = end + 1
            continue
        if lines[i].strip():
            mark = None  # a mark applies to the block right after it
        i += 1


def _in_block(doc: str, first: int, block: list[str],
              mark: tuple[str, str] | None) -> Iterator[Example]:  # fmt: skip
    where, topology, code = "host", "two-dev", 0
    if mark:
        words = [mark[0], *mark[1].split()]
        if "exit" in words:  # '... exit N': the status the example must end with
            at = words.index("exit")
            code = int(words[at + 1])
            del words[at : at + 2]
        if words and words[0] == "testbed":
            where, topology = "testbed", words[1] if len(words) > 1 else "two-dev"
        elif words and words[0] in ("gpu", "host", "nogpu", "nocxl", "harness"):
            where = words[0]
        elif words:
            raise ValueError(f"{doc}:{first - 1}: unknown smoke mark {mark[0]!r}")
    python = [ln for ln in block if ln.startswith((">>> ", "... "))]
    if python:
        source = "\n".join(ln[4:] for ln in python)
        yield Example(doc, first, "python", source, where, topology, code)
        return
    current: Example | None = None
    for n, line in enumerate(block):
        if line.startswith("$ "):
            if current:
                yield current
            command, w, topo = line[2:].strip(), where, topology
            m = _TESTBED.match(command)
            if m:  # run inside the guest, with the rest of that topology's examples
                command, w, topo = m.group(3), "testbed", m.group(1) or m.group(2) or "two-dev"
            current = Example(doc, first + n, "shell", command, w, topo, code)
        elif current is not None:
            current.shown.append(line)
    if current:
        yield current


# --- output shape ----------------------------------------------------------------------
def table_headers(lines: list[str]) -> list[list[str]]:
    """The header row (as column names) of every table in ``lines``."""
    out = []
    for a, b in itertools.pairwise(lines):
        if _DASHES.match(b) and a.strip() and not _DASHES.match(a):
            out.append(re.split(r"\s{2,}", a.strip()))
    return out


def json_keys(text: str) -> set[str]:
    """Every key of a JSON document (or of the JSON-like excerpt the docs show)."""
    try:
        return _keys(json.loads(text))
    except ValueError:
        return set(re.findall(r'"([A-Za-z_][\w ]*)"\s*:', text))


def _keys(doc: object) -> set[str]:
    if isinstance(doc, dict):
        return set(doc) | {k for v in doc.values() for k in _keys(v)}
    if isinstance(doc, list):
        return {k for v in doc for k in _keys(v)}
    return set()


def shape_problems(ex: Example, stdout: str) -> list[str]:
    """What the docs show that the real output lacks (table columns, JSON keys)."""
    shown = "\n".join(ex.shown)
    problems = []
    if shown.lstrip().startswith(("{", "[")):
        missing = json_keys(shown) - json_keys(stdout)
        if missing:
            problems.append(f"JSON keys the docs show are missing: {sorted(missing)}")
        return problems
    real = table_headers(stdout.splitlines())
    for header in table_headers(ex.shown):
        # the docs' columns, in order, in one of the real tables (a matrix has a column
        # per target, so a machine with more targets prints more of them)
        if not any(_in_order(header, r) for r in real):
            problems.append(f"no table with columns {header}; tables: {real}")
    return problems


def _in_order(wanted: list[str], columns: list[str]) -> bool:
    it = iter(columns)
    return all(any(c == w for c in it) for w in wanted)
