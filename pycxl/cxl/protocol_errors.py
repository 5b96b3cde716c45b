"""CXL protocol errors injected at a downstream port through the platform's ACPI EINJ
(the kernel's debugfs ``cxl/einj_types`` and ``cxl/<dport>/einj_inject``), as ndctl's
``inject-protocol-error``: for testing the AER path, on platforms whose firmware offers
CXL error types.
"""

from __future__ import annotations

from ..base.errors import NotAvailableError, NotFoundError
from ..base.plan import Plan, write
from ..base.sysfs import Sysfs
from ..base.values import word
from . import device_ops
from .device_ops import DeviceResult
from .poison import DEBUGFS

EINJ_TYPES = f"{DEBUGFS}/cxl/einj_types"
# ndctl's names of the EINJ CXL error types (ACPI 6.5 table 18.30)
PROTOCOL_ERRORS = {
    "cache-correctable": 0x1000,
    "cache-uncorrectable": 0x2000,
    "cache-fatal": 0x4000,
    "mem-correctable": 0x8000,
    "mem-uncorrectable": 0x10000,
    "mem-fatal": 0x20000,
}


def offered_protocol_errors(fs: Sysfs) -> tuple[str, ...] | None:
    """ndctl's names of the error types the platform offers (None: no EINJ to ask)."""
    try:
        return tuple(available_types(fs))
    except NotAvailableError:
        return None


def available_types(fs: Sysfs) -> dict[str, int]:
    """The error types this platform's EINJ offers, by ndctl's names."""
    if not fs.exists(EINJ_TYPES):
        raise NotAvailableError(
            f"{EINJ_TYPES} is absent: the platform's firmware has no ACPI EINJ table with CXL "
            "error types (or the kernel lacks CONFIG_ACPI_APEI_EINJ_CXL, or debugfs is not "
            f"mounted: mount -t debugfs none {DEBUGFS})"
        )
    codes = set()
    for line in fs.iter_lines(EINJ_TYPES):
        head = line.split()[0] if line.split() else ""
        try:
            codes.add(int(head, 16))
        except ValueError:
            continue
    return {name: code for name, code in PROTOCOL_ERRORS.items() if code in codes}


def inject_protocol_error(
    dport: str,
    error: str,
    *,
    system: device_ops.Host | None = None,
    dry_run: bool = False,
) -> DeviceResult:
    """Inject ``error`` (cache-correctable ... mem-fatal) at downstream port ``dport``
    (its device name: 0000:0c:00.0, or pci0000:0c for a host bridge)."""
    dport, dry_run = device_ops.name(dport, "dport"), device_ops.flag(dry_run, "dry_run")
    error = word(error, "error type", PROTOCOL_ERRORS)
    fs = device_ops.host(system)
    topo = device_ops.topology(fs)
    known = [d.name for p in topo.all_ports for d in p.dports]
    if dport not in known:
        raise NotFoundError("dport", dport, known)
    offered = available_types(fs)
    if error not in offered:
        raise NotAvailableError(f"this platform's EINJ does not offer {error}; it offers: "
                                f"{', '.join(offered) or 'no CXL error type'}")  # fmt: skip
    path = f"{DEBUGFS}/cxl/{dport}/einj_inject"
    if not fs.exists(path):
        raise NotAvailableError(f"{path} is absent: {dport} cannot take injected errors")
    step = write(f"inject a {error} protocol error at {dport}", path,
                 f"{PROTOCOL_ERRORS[error]:#x}")  # fmt: skip
    plan = Plan(f"inject-protocol-error {dport}", (step,))
    done = device_ops.run(fs, dport, plan, dry_run=dry_run, what="error injection")
    return DeviceResult(dport, plan, done, details={"error": error})
