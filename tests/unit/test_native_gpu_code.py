"""The GPU code that can be proven without a GPU: the PTX modules assemble (NVIDIA's
ptxas, from the nvidia-cuda-nvcc wheel) for the oldest and newest targets pycxl names,
the committed STREAM PTX is its generator's output, and the copy threads of the staged
transfer copy every byte."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pycxl.base._lib.compiled import CopyTeam

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
    """One chunk from an unaligned staging buffer into 16-aligned pageable memory (the
    side non-temporal stores write), with the same threads stream after stream."""
    src = np.random.default_rng(size).integers(0, 255, size + 8, dtype=np.uint8)[8:]
    dst = np.zeros(size + 24, dtype=np.uint8)[16:-8]  # 16-aligned start, an unaligned source
    pool = CopyTeam([0, 0])
    try:
        for _ in range(3):
            dst[:] = 0
            with pool.transfer(dst.ctypes.data, [src.ctypes.data], size, size, to_host=True,
                             nt=bool(nt), opened=1):  # fmt: skip
                pass
            assert np.array_equal(dst, src)
    finally:
        pool.close()


@pytest.mark.parametrize("to_host", [False, True])
@pytest.mark.parametrize(
    ("size", "chunk", "depth"),
    [(0, 4096, 2), (5000, 4096, 2), ((3 << 20) + 77, 300 << 10, 3), ((8 << 20) + 4096, 1 << 20, 4)],
)
def test_copy_stream_keeps_the_buffer_protocol(size: int, chunk: int, depth: int,
                                               to_host: bool) -> None:  # fmt: skip
    """The staged copier's stream with the engine's side done here by memcpy: every byte
    arrives, a chunk is complete when `wait` returns, and the threads never write a
    staging buffer before it is opened again (that would corrupt the chunk not yet
    moved out of it)."""
    rng = np.random.default_rng(size + chunk)
    source = rng.integers(0, 255, size, dtype=np.uint8)
    host = source.copy() if not to_host else np.zeros(size, dtype=np.uint8)
    device = np.zeros(size, dtype=np.uint8) if not to_host else source.copy()
    stage = [np.zeros(chunk, dtype=np.uint8) for _ in range(depth)]
    chunks = -(-size // chunk)
    cpus = sorted(os.sched_getaffinity(0))
    pool = CopyTeam([cpus[i % len(cpus)] for i in range(3)])
    try:
        for _ in range(2):  # the same threads, stream after stream
            host[:] = 0 if to_host else source
            device[:] = source if to_host else 0
            stage_ptrs = [b.ctypes.data for b in stage]
            span = lambda i: slice(i * chunk, min(size, (i + 1) * chunk))  # noqa: E731
            if not to_host:
                with pool.transfer(host.ctypes.data, stage_ptrs, size, chunk, to_host=False,
                                 nt=False, opened=depth) as copy:  # fmt: skip
                    for i in range(chunks):
                        copy.wait(i)
                        part = span(i)
                        device[part] = stage[i % depth][: part.stop - part.start]
                        if i + depth < chunks:
                            copy.open(i + depth + 1)
                assert np.array_equal(device, source)
            else:
                for i in range(min(depth, chunks)):
                    part = span(i)
                    stage[i][: part.stop - part.start] = device[part]
                with pool.transfer(host.ctypes.data, stage_ptrs, size, chunk, to_host=True,
                                 nt=True, opened=0) as copy:  # fmt: skip
                    for i in range(chunks):
                        copy.open(i + 1)
                        copy.wait(i)
                        if i + depth < chunks:
                            part = span(i + depth)
                            stage[i % depth][: part.stop - part.start] = device[part]
                assert np.array_equal(host, source)
    finally:
        pool.close()


def test_copy_stream_stops_on_an_error() -> None:
    """An error inside the stream stops the threads before chunks never opened, and the
    pool streams normally after."""
    size, chunk = 4 << 20, 1 << 20
    host = np.full(size, 7, dtype=np.uint8)
    stage = [np.zeros(chunk, dtype=np.uint8) for _ in range(2)]
    pool = CopyTeam([0, 0])
    try:
        ptrs = [b.ctypes.data for b in stage]
        with pytest.raises(RuntimeError), pool.transfer(host.ctypes.data, ptrs, size, chunk,
                                                      to_host=False, nt=False,
                                                      opened=1) as copy:  # fmt: skip
            copy.wait(0)
            raise RuntimeError("the engine failed")
        assert stage[0].min() == 7 and stage[1].max() == 0  # chunk 1 was never opened
        stage[1][:] = 0
        with pool.transfer(host.ctypes.data, ptrs, size, chunk, to_host=False, nt=False,
                         opened=4) as copy:  # fmt: skip
            copy.wait(3)  # the last chunk went through buffer 1
        assert stage[1].min() == 7
    finally:
        pool.close()
