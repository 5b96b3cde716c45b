"""The GPU code that can be proven without a GPU: the PTX kernels assemble (NVIDIA's
ptxas, from the nvidia-cuda-nvcc wheel) for the oldest and newest targets pycxl names,
the committed STREAM PTX is its generator's output, and the copy threads of the staged
transfer copy every byte."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pycxl._lib.compiled import kernels

ROOT = Path(__file__).resolve().parents[2]
PTX = ("stream.ptx", "chase.ptx")


def _ptxas() -> Path:
    spec = importlib.util.find_spec("nvidia.cuda_nvcc")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("ptxas is missing: pip install -e '.[test]' (nvidia-cuda-nvcc-cu12)")
    tool = Path(next(iter(spec.submodule_search_locations))) / "bin" / "ptxas"
    tool.chmod(tool.stat().st_mode | 0o111)  # wheels do not keep the executable bit
    return tool


@pytest.mark.parametrize("arch", ["sm_70", "sm_90"])
@pytest.mark.parametrize("name", PTX)
def test_ptx_assembles(name: str, arch: str, tmp_path: Path) -> None:
    out = tmp_path / "k.cubin"
    p = subprocess.run(
        [str(_ptxas()), f"-arch={arch}", str(ROOT / "native" / name), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    assert out.stat().st_size > 0


def test_stream_ptx_is_the_generators_output() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_stream_ptx
    finally:
        sys.path.pop(0)
    committed = (ROOT / "native" / "stream.ptx").read_text()
    assert committed == gen_stream_ptx.generate(), "run python3 scripts/gen_stream_ptx.py"
    for kernel in ("copy", "scale", "add", "triad"):
        for unroll in (1, 2, 4):
            assert f".entry stream_{kernel}_u{unroll}(" in committed


@pytest.mark.parametrize("nt", [0, 1])
@pytest.mark.parametrize("size", [1, 4095, 4097, (8 << 20) + 123])
def test_copy_threads_copy_every_byte(size: int, nt: int) -> None:
    ffi, lib = kernels()
    src = np.random.default_rng(size).integers(0, 255, size + 8, dtype=np.uint8)[8:]
    dst = np.zeros(size + 24, dtype=np.uint8)[16:-8]  # 16-aligned start, an unaligned source
    pool = lib.copy_pool_create(2, ffi.new("int[]", [0, 0]))
    assert pool != ffi.NULL
    try:
        for _ in range(3):  # the same threads, copy after copy
            dst[:] = 0
            lib.copy_pool_run(pool, ffi.from_buffer(dst), ffi.from_buffer(src), size, nt)
            assert np.array_equal(dst, src)
    finally:
        lib.copy_pool_destroy(pool)
