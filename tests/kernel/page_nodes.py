"""Touch N MiB of fresh anonymous memory and print its pages per NUMA node (JSON).

Run under a memory policy (numactl ...); the node of each page comes from the kernel
through move_pages(2) with no target nodes, which only reports where pages are.
"""

import ctypes
import json
import mmap
import sys

size = int(sys.argv[1]) << 20
page = mmap.PAGESIZE
buf = mmap.mmap(-1, size)
for off in range(0, size, page):
    buf[off] = 1
base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
count = size // page
pages = (ctypes.c_void_p * count)(*[base + i * page for i in range(count)])
status = (ctypes.c_int * count)()
libnuma = ctypes.CDLL("libnuma.so.1", use_errno=True)
if libnuma.move_pages(0, ctypes.c_ulong(count), pages, None, status, 0) != 0:
    sys.exit(f"move_pages failed: errno {ctypes.get_errno()}")
counts: dict[int, int] = {}
for node in status:
    counts[node] = counts.get(node, 0) + 1
print(json.dumps(counts))
