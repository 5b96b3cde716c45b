"""pycxl: see, configure and measure every memory tier of a GPU host.

GPU HBM, CPU DRAM and CXL memory expanders, named as tiers (``dram0``, ``cxl0``,
``gpu0``; ``node3``, ``cpu5``) across the whole library::

    >>> import pycxl
    >>> system = pycxl.snapshot()               # CXL objects, NUMA nodes, GPUs, read once
    >>> [n.name for n in system.nodes]          # ['dram0', 'cxl0']
    >>> system.resolve("cxl0").node             # NUMA node id of the first CXL tier
    >>> buf = pycxl.allocate("64M", "cxl0")     # memory bound to that node
    >>> buf.pages_by_node()                     # {1: 16384}
    >>> pycxl.create_region(pycxl.RegionRequest(ways=2)).tier   # 'cxl0' (as root)
    >>> from pycxl import bench
    >>> bench.measure_latency("cxl0")[0].latency_ns

What is here:

- ``snapshot``, ``System``: the host's memory, and every name resolved against it.
- ``allocate``, ``migrate``, ``NumaBuffer``, ``Policy``: memory on tiers, by name.
- ``create_region``, ``destroy_region``, ``enable_region``, ``disable_region``,
  ``RegionRequest``, ``RegionResult``: CXL regions, validated, planned, undoable.
- ``host_memory``, ``pinned_array``, ``pinned_tensor``: memory on a tier, pinned and
  mapped for a GPU (a numpy array, a PyTorch tensor that is_pinned());
  ``probe_longterm_pins``: whether a tier keeps long-term-pinned pages, by trying;
  ``map_dax``: a devdax region's memory mapped directly.
- ``offload_layers``: a PyTorch model's layers streamed to the GPU from a tier while it
  computes, and their optimizer state kept and updated there (ZeRO-Offload);
  ``offload_model``: a whole model trained with its blocks' optimizer state on a tier,
  each block updated on the CPU or the GPU, whichever finishes it first; ``fit`` and
  ``TrainShape``: whether a model trains so on this machine, where its bytes would live
  and the step's bound, before any memory is taken.
- ``list_json``, ``ListRequest``: what ``pycxl list --json`` prints.
- ``top``: live traffic per GPU link and per memory tier, report by report.
- CXL device operations, each validated, planned (``dry_run=True`` shows the writes) and
  undone on failure, returning a ``DeviceResult``: ``read_labels``, ``write_labels``,
  ``zero_labels``; ``disable_memdev``, ``enable_memdev``, ``disable_port``,
  ``enable_port``, ``disable_bus``, ``enable_bus``; ``reserve_dpa``, ``free_dpa``;
  ``set_partition``; ``update_firmware``, ``cancel_firmware_update``;
  ``set_alert_config`` (``AlertChange``); ``sanitize``, ``wait_sanitize``;
  ``inject_poison``, ``clear_poison``; ``inject_protocol_error``.
- ``pycxl.bench``: latency, bandwidth, first touch, transfers, the matrix.
- ``PycxlError`` and its subclasses: every error, each with a message to act on.

Importing pycxl loads no shared library and no numpy; each part loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base._lazy import lazy_exports
from .base.errors import (
    CommandNotExecutableError as CommandNotExecutableError,
    CommandNotFoundError as CommandNotFoundError,
    CudaError as CudaError,
    InvalidRequestError as InvalidRequestError,
    LibraryNotFoundError as LibraryNotFoundError,
    NeedsRootError as NeedsRootError,
    NotAvailableError as NotAvailableError,
    NotFoundError as NotFoundError,
    OperationError as OperationError,
    PlacementError as PlacementError,
    PycxlError as PycxlError,
    SysfsError as SysfsError,
    TestbedError as TestbedError,
)

__version__ = "0.1.0"

if TYPE_CHECKING:
    from . import bench as bench
    from .byname.facade import (
        allocate as allocate,
        create_region as create_region,
        destroy_region as destroy_region,
        disable_region as disable_region,
        enable_region as enable_region,
        fit as fit,
        host_memory as host_memory,
        map_dax as map_dax,
        migrate as migrate,
        move as move,
        offload_layers as offload_layers,
        offload_model as offload_model,
        on_tier as on_tier,
        pinned_array as pinned_array,
        pinned_tensor as pinned_tensor,
        probe_longterm_pins as probe_longterm_pins,
        spill_to as spill_to,
        tier_pool as tier_pool,
    )
    from .byname.listing import ListRequest as ListRequest, list_json as list_json
    from .cxl.alerts import AlertChange as AlertChange, set_alert_config as set_alert_config
    from .cxl.binding import (
        disable_bus as disable_bus,
        disable_memdev as disable_memdev,
        disable_port as disable_port,
        enable_bus as enable_bus,
        enable_memdev as enable_memdev,
        enable_port as enable_port,
    )
    from .cxl.device_ops import DeviceResult as DeviceResult
    from .cxl.dpa import free_dpa as free_dpa, reserve_dpa as reserve_dpa
    from .cxl.firmware import (
        cancel_firmware_update as cancel_firmware_update,
        update_firmware as update_firmware,
    )
    from .cxl.label_area import (
        read_labels as read_labels,
        write_labels as write_labels,
        zero_labels as zero_labels,
    )
    from .cxl.partition import set_partition as set_partition
    from .cxl.poison import clear_poison as clear_poison, inject_poison as inject_poison
    from .cxl.protocol_errors import inject_protocol_error as inject_protocol_error
    from .cxl.read import read_cxl as read_cxl
    from .cxl.region_layout import RegionRequest as RegionRequest
    from .cxl.regions import RegionResult as RegionResult
    from .cxl.sanitize import sanitize as sanitize, wait_sanitize as wait_sanitize
    from .numa.placement import NumaBuffer as NumaBuffer
    from .numa.policy import Policy as Policy
    from .ops.top import top as top
    from .resolve.system import System as System, snapshot as snapshot
    from .torch.offload.train_shape import TrainShape as TrainShape

# Every public name but the errors above, and the submodule each is loaded from on first
# use ('' for a subpackage of that name); __all__ and dir() are made from it.
_LAZY = {
    **dict.fromkeys(("snapshot", "System"), "resolve.system"),
    "read_cxl": "cxl.read",
    **dict.fromkeys(
        ("allocate", "migrate", "host_memory", "probe_longterm_pins", "map_dax", "pinned_array",
         "pinned_tensor", "offload_layers", "offload_model", "create_region", "destroy_region",
         "disable_region", "enable_region", "tier_pool", "on_tier", "spill_to", "move", "fit"),
        "byname.facade",
    ),
    "TrainShape": "torch.offload.train_shape",
    "RegionRequest": "cxl.region_layout",
    # CXL device operations (ndctl's memdev, port and bus commands)
    **dict.fromkeys(("read_labels", "write_labels", "zero_labels"), "cxl.label_area"),
    **dict.fromkeys(("disable_memdev", "enable_memdev", "disable_port", "enable_port",
                     "disable_bus", "enable_bus"), "cxl.binding"),
    **dict.fromkeys(("reserve_dpa", "free_dpa"), "cxl.dpa"),
    **dict.fromkeys(("inject_poison", "clear_poison"), "cxl.poison"),
    **dict.fromkeys(("set_alert_config", "AlertChange"), "cxl.alerts"),
    **dict.fromkeys(("sanitize", "wait_sanitize"), "cxl.sanitize"),
    **dict.fromkeys(("update_firmware", "cancel_firmware_update"), "cxl.firmware"),
    "set_partition": "cxl.partition",
    "inject_protocol_error": "cxl.protocol_errors",
    "DeviceResult": "cxl.device_ops",
    "RegionResult": "cxl.regions",
    "NumaBuffer": "numa.placement",
    "Policy": "numa.policy",
    "ListRequest": "byname.listing",
    "list_json": "byname.listing",
    "top": "ops.top",
    **dict.fromkeys(("bench", "cxl", "gpu", "numa", "testbed"), ""),  # the subpackages
}  # fmt: skip
_ERRORS = (
    "CommandNotExecutableError", "CommandNotFoundError", "CudaError", "InvalidRequestError",
    "LibraryNotFoundError", "NeedsRootError", "NotAvailableError", "NotFoundError",
    "OperationError", "PlacementError", "PycxlError", "SysfsError", "TestbedError",
)  # fmt: skip

__all__ = sorted(["__version__", *_ERRORS, *_LAZY])

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
