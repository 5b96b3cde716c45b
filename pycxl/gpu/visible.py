"""Which GPUs CUDA shows this process, and their CUDA ordinals, decided without CUDA.

CUDA numbers the GPUs this process can open fastest first (the default) or by PCI bus id
(``CUDA_DEVICE_ORDER=PCI_BUS_ID``); GPUs of one model and compute capability tie on speed
and keep their PCI order. ``CUDA_VISIBLE_DEVICES`` then keeps the GPUs it names (indexes
in that order, or ``GPU-`` UUIDs and their unique prefixes), in the order it names them:
their ordinals. Where that cannot be settled without CUDA (indexes on a host with mixed
models, MIG instances, an entry CUDA would stop at), ``Undecided`` says why and the
caller asks CUDA.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ..base.values import is_digits
from .inventory import GpuDevice


class Undecided(Exception):
    """Only CUDA can say which GPUs it shows; the message says why."""


def select_visible(found: Sequence[GpuDevice], environ: Mapping[str, str]) -> tuple[GpuDevice, ...]:
    """The GPUs of ``found`` that CUDA shows, in PCI bus order (gpu0, gpu1...), each with
    its CUDA ordinal where that is certain (else None)."""
    by_bus = sorted(found, key=lambda d: d.pci_bus_id)
    models = {(d.name, d.compute_capability) for d in by_bus}
    pci_order = len(models) <= 1 or environ.get("CUDA_DEVICE_ORDER", "") == "PCI_BUS_ID"
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        ordinals = {d.pci_bus_id: (i if pci_order else None) for i, d in enumerate(by_bus)}
    else:
        ordinals = {}
        entries = [e.strip() for e in spec.split(",")] if spec.strip() else []
        for pos, entry in enumerate(entries):
            d = _named(entry, by_bus, pci_order)
            if d.pci_bus_id in ordinals:
                raise Undecided(f"CUDA_VISIBLE_DEVICES names {entry!r} twice")
            ordinals[d.pci_bus_id] = pos
    shown = [d for d in by_bus if d.pci_bus_id in ordinals]
    return tuple(
        dataclasses.replace(d, index=i, ordinal=ordinals[d.pci_bus_id]) for i, d in enumerate(shown)
    )


def _named(entry: str, by_bus: Sequence[GpuDevice], pci_order: bool) -> GpuDevice:
    if is_digits(entry):  # as CUDA reads it: ASCII digits
        if not pci_order:
            raise Undecided(
                "CUDA_VISIBLE_DEVICES numbers GPUs fastest first, an order only CUDA knows on "
                "a host with different GPU models (CUDA_DEVICE_ORDER=PCI_BUS_ID fixes it)"
            )
        if int(entry) >= len(by_bus):
            raise Undecided(f"CUDA_VISIBLE_DEVICES names GPU {entry}, which does not exist")
        return by_bus[int(entry)]
    if entry[:4].upper() == "GPU-":
        matches = [d for d in by_bus if d.uuid.lower().startswith(entry.lower())]
        if len(matches) == 1:
            return matches[0]
    raise Undecided(f"CUDA_VISIBLE_DEVICES entry {entry!r} names no single GPU")
