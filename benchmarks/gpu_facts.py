"""What NVML, the NVIDIA driver's files and the CUDA driver each say about every GPU, side
by side, and how long each takes to start: the evidence behind ``pycxl list``'s GPU facts.

    python3 benchmarks/gpu_facts.py

Prints one line per fact and source; a call that fails prints its error and the rest go
on. CUDA is started last (after every NVML figure), as it costs the most.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any


def timed(what: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # a diagnostic: say it and go on
        print(f"{what}: FAILED {type(e).__name__}: {e}")
        return None
    print(f"{what}: {(time.perf_counter() - t0) * 1e3:.2f} ms")
    return out


def show(what: str, fn: Callable[[], Any]) -> None:
    try:
        print(f"  {what}: {fn()}")
    except Exception as e:
        print(f"  {what}: FAILED {type(e).__name__}: {e}")


def nvml_raw() -> None:
    from pycxl.base._lib.libs import LIBNVML
    from pycxl.gpu.nvml import NODE_MASK_WORDS, NVML_ADDRESSING_MODE_V1, NVML_MEMORY_V2

    ffi, lib = timed("NVML load (dlopen, prebuilt declarations)", LIBNVML.load)
    timed("nvmlInit_v2", lib.nvmlInit_v2)
    count = ffi.new("unsigned int *")
    lib.nvmlDeviceGetCount_v2(count)
    for i in range(count[0]):
        dev_p = ffi.new("nvmlDevice_t *")
        rc = timed(
            f"nvmlDeviceGetHandleByIndex_v2({i})",
            partial(lib.nvmlDeviceGetHandleByIndex_v2, i, dev_p),
        )
        print(f"NVML device {i} (handle rc {rc})")
        dev = dev_p[0]
        mem = ffi.new("nvmlMemory_v2_t *")
        mem.version = NVML_MEMORY_V2
        rc = lib.nvmlDeviceGetMemoryInfo_v2(dev, mem)
        print(f"  memory v2 rc {rc}: total {mem.total} reserved {mem.reserved} free {mem.free} "
              f"used {mem.used}; total-reserved {mem.total - mem.reserved}")  # fmt: skip
        cores = ffi.new("unsigned int *")
        print(f"  nvmlDeviceGetNumGpuCores rc {lib.nvmlDeviceGetNumGpuCores(dev, cores)}: "
              f"{cores[0]}")  # fmt: skip
        mask = ffi.new(f"unsigned long[{NODE_MASK_WORDS}]")
        rc = timed(
            "  nvmlDeviceGetMemoryAffinity(node), the nearest node's driver answer",
            partial(lib.nvmlDeviceGetMemoryAffinity, dev, NODE_MASK_WORDS, mask, 0),
        )
        print(f"  nvmlDeviceGetMemoryAffinity(node) rc {rc}: {[hex(mask[w]) for w in range(2)]}")
        rc = lib.nvmlDeviceGetMemoryAffinity(dev, NODE_MASK_WORDS, mask, 1)
        print(f"  nvmlDeviceGetMemoryAffinity(socket) rc {rc}: {[hex(mask[w]) for w in range(2)]}")
        mode = ffi.new("nvmlDeviceAddressingMode_t *")
        mode.version = NVML_ADDRESSING_MODE_V1
        try:
            rc = lib.nvmlDeviceGetAddressingMode(dev, mode)
            print(f"  nvmlDeviceGetAddressingMode rc {rc}: {mode.value}")
        except AttributeError:
            print("  nvmlDeviceGetAddressingMode: not in this driver's NVML")
    timed("nvmlShutdown", lib.nvmlShutdown)


def pynvml_extras() -> None:
    """What pycxl does not read, from NVIDIA's own Python binding where installed."""
    try:
        import pynvml
    except ImportError:
        print("pynvml (nvidia-ml-py) not installed: extras skipped")
        return
    pynvml.nvmlInit()
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        print(f"pynvml device {i}")
        show("memory v1 total", lambda h=h: pynvml.nvmlDeviceGetMemoryInfo(h).total)
        show("nvmlDeviceGetNumaNodeId", lambda h=h: pynvml.nvmlDeviceGetNumaNodeId(h))
        show("nvmlDeviceGetAttributes_v2 multiprocessorCount",
             lambda h=h: pynvml.nvmlDeviceGetAttributes_v2(h).multiprocessorCount)  # fmt: skip
        show("persistence mode", lambda h=h: pynvml.nvmlDeviceGetPersistenceMode(h))
        show("cpu affinity", lambda h=h: [hex(x) for x in pynvml.nvmlDeviceGetCpuAffinity(h, 4)])
    pynvml.nvmlShutdown()


def pycxl_sources() -> None:
    from pycxl.base.sysfs import Sysfs
    from pycxl.gpu import read_gpus
    from pycxl.gpu.procfs import read_inventory

    for what, fn in [
        ("read_gpus(via='nvml') (NVML)", lambda: read_gpus(via="nvml")),
        ("read_gpus(via='nvml') again", lambda: read_gpus(via="nvml")),
        ("driver files", lambda: read_inventory(Sysfs("/"), os.environ)),
        ("read_gpus(via='cuda') (starts CUDA)", lambda: read_gpus(via="cuda")),
        ("read_gpus(via='cuda') again", lambda: read_gpus(via="cuda")),
    ]:
        inv = timed(what, fn)
        for g in inv.devices if inv else ():
            print(f"  {g}")
        if inv is not None and inv.absent_reason:
            print(f"  absent: {inv.absent_reason}")


def cuda_raw() -> None:
    from pycxl.gpu import driver as drv

    ffi, lib = drv.driver()
    count = ffi.new("int *")
    lib.cuDeviceGetCount(count)
    for ordinal in range(count[0]):
        dev = ffi.new("CUdevice *")
        lib.cuDeviceGet(dev, ordinal)
        mem = ffi.new("size_t *")
        lib.cuDeviceTotalMem_v2(mem, dev[0])
        attrs = {}
        for name in ("MULTIPROCESSOR_COUNT", "HOST_NUMA_ID", "PAGEABLE_MEMORY_ACCESS",
                     "L2_CACHE_SIZE"):  # fmt: skip
            v = ffi.new("int *")
            rc = lib.cuDeviceGetAttribute(v, getattr(drv, f"ATTR_{name}"), dev[0])
            attrs[name] = v[0] if rc == 0 else f"rc {rc}"
        print(f"CUDA device {ordinal}: cuDeviceTotalMem {mem[0]} {attrs}")


def _text(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def kernel_files() -> None:
    print("kernel files")
    for path in ("/sys/devices/system/node/has_cpu", "/sys/devices/system/node/online"):
        show(path, lambda path=path: _text(path))
    for bus in sorted(os.listdir("/proc/driver/nvidia/gpus")):
        show(f"{bus} numa_node", lambda bus=bus: _text(f"/sys/bus/pci/devices/{bus}/numa_node"))


def main() -> int:
    for step in (kernel_files, nvml_raw, pynvml_extras, pycxl_sources, cuda_raw):
        try:
            step()
        except Exception as e:
            print(f"{step.__name__}: FAILED {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
