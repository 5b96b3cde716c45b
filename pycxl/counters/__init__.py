"""Live counters of memory traffic, one module per source, each behind the same few
names (as psutil's per-platform backends): ``open_reader`` in a source's module returns
``Reader`` objects, whose ``read()`` gives a ``Reading``: counts that only grow
(differences of two readings are the traffic between them), figures a source can only
give as rates, and, for each figure a host lacks, ``Missing``: the reason in words,
never a zero.

Sources: NVML for GPU links (``pycxl.gpu.link_counters``), perf PMUs of memory
controllers and CXL devices (``memory_pmus``, through ``perf_event``), resctrl's memory
bandwidth monitoring (``resctrl``), and the page traffic every kernel counts
(``page_traffic``). Subjects are node ids and GPU indexes; names are given on floor 3.
"""
