"""The measurements themselves, one module each, of what names were resolved into (a
``pycxl.measure.targets.Pair``, or a ``GpuDevice`` for a GPU's own memory): latency, bandwidth,
first touch, loaded latency, transfers, GPU chase and STREAM, layer offload, and their
typed results. By name (``"cxl0"``, ``"gpu0"``), they are ``pycxl.bench``'s."""
