"""The former name of ``pci_link``, for ``ops/check.py`` until it imports ``pci_link``:
nothing is defined here."""

from __future__ import annotations

from .pci_link import Link as Link, read_link as read_link
