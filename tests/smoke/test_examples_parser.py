"""The smoke layer's reading of the docs: marks, commands, shown output, and a shape
check that does fail when the real output differs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.smoke.examples import Example, examples, shape_problems

DOC = """
<!-- smoke: testbed four-dev exit 2 -->
```
$ pycxl list -d root
Decoders
decoder     kind    port
----------  ------  ------
decoder0.0  root    root0
$ pycxl testbed -t two-dev -- pycxl list
```

```
$ pycxl list --json
[{"memdev": "mem0", "serial": 1}]
```

<!-- smoke: skip: needs a person -->
```
$ rm -rf /
```

```python
>>> x = 1
... y = 2
```
"""


def test_marks_commands_and_shown_output(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text(DOC)
    found = list(examples([doc]))
    assert [(e.text, e.where, e.topology, e.exit) for e in found] == [
        ("pycxl list -d root", "testbed", "four-dev", 2),
        ("pycxl list", "testbed", "two-dev", 2),
        ("pycxl list --json", "host", "two-dev", 0),
        ("x = 1\ny = 2", "host", "two-dev", 0),
    ]
    assert found[0].shown[1].startswith("decoder ")


def test_shape_check_catches_a_changed_table_or_json() -> None:
    shown = ["decoder     kind    port", "----------  ------  ------", "x  y  z"]
    ex = Example("d.md", 1, "shell", "pycxl list -d root", shown=shown)
    same = "Decoders\ndecoder     kind    port\n----------  ------  ------\nd0  root  root0\n"
    assert shape_problems(ex, same) == []
    other = "decoder     kind\n----------  ------\nd0  root\n"
    assert shape_problems(ex, other) != []
    more = "decoder     kind    port    extra\n---  ---  ---  ---\nd0  root  root0  x\n"
    assert shape_problems(ex, more) == []  # more columns (a matrix's targets) are fine
    moved = "kind    decoder     port\n---  ---  ---\nroot  d0  root0\n"
    assert shape_problems(ex, moved) != []
    js = Example("d.md", 1, "shell", "x", shown=['[{"memdev": "mem0", "serial": 1}]'])
    assert shape_problems(js, '[{"memdev": "mem1", "serial": 2, "host": "h"}]') == []
    assert shape_problems(js, '[{"memdev": "mem1"}]') != []


def test_a_skip_needs_a_reason(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text("<!-- smoke: skip -->\n```\n$ true\n```\n")
    with pytest.raises(ValueError, match="needs a reason"):
        list(examples([doc]))
