"""GPU tests (run on the GPU machine) and what they share."""


def dram0_node() -> int:
    """The host node dram0 names on this machine (the GPU tests' stand-in tier)."""
    from pycxl.resolve.system import snapshot

    node = snapshot(gpus=False).resolve("dram0").node
    assert node is not None
    return node
