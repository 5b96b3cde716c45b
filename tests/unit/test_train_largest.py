"""benchmarks/train_largest.py on the CPU at a small shape (no GPU here): the placement
fit chose, trained with the loop people write, and its losses against the same slice
trained in fp32 by torch's AdamW. (Speed and the 13 B run are the GPU machine's.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "train_largest.py"
SMALL = ["--layers", "3", "--hidden", "256", "--intermediate", "512", "--vocab", "1000",
         "--tokens", "64", "--gpu", "none", "--hbm-free", "4G", "--steps", "6"]  # fmt: skip


def _run(*extra: str) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), *SMALL, *extra], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_slice_trained_with_pycxl_matches_fp32_training_within_bf16s_tolerance() -> None:
    out = _run("--slice", "2")
    pycxl = re.search(r"pycxl losses\s+\[(.*)\]", out)
    fp32 = re.search(r"HBM fp32 reference\s+\[(.*)\]", out)
    assert pycxl and fp32, out
    ours = [float(v) for v in pycxl.group(1).split(",")]
    theirs = [float(v) for v in fp32.group(1).split(",")]
    assert len(ours) == len(theirs) == 6, out
    assert ours[-1] < ours[0] - 0.1, out  # it learns (the data repeats every 4 steps)
    assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) < 0.01, out


def test_the_run_prints_its_step_and_fits_bytes_beside_what_it_held() -> None:
    out = _run()
    assert re.search(r"pycxl, weights .*: 0.00\d+ B parameters, step \d+ ms", out), out
    assert re.search(r"fit's tier [\d.]+ GiB, held [\d.]+ GiB", out), out
    assert re.search(r"losses \[[\d., ]+\]", out), out


def test_largest_trains_the_most_blocks_that_fit_and_no_more() -> None:
    """--largest: fit's answer over the block count (one more does not fit), then a step
    of that model (fewer layers asked than fit: it grows past them)."""
    out = _run("--largest", "--hbm-free", "1200M", "--tier-free", "100M", "--steps", "1")
    most = re.search(r"the most blocks of this shape that fit here: (\d+) \(([\d.]+) B param"
                     r"eters; (\d+) do not fit\)", out)  # fmt: skip
    assert most, out
    assert int(most.group(1)) > 3 and int(most.group(3)) == int(most.group(1)) + 1, out
    assert f": {most.group(2)} B parameters, step" in out, out  # the model trained is that one
