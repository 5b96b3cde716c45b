"""PyTorch, imported on first use by the modules that need it (so ``import pycxl`` never
imports it), with a message that says what needed it."""

from __future__ import annotations

from typing import Any

from ..base.errors import NotAvailableError


def import_torch(needed_for: str = "layer offload") -> Any:
    """PyTorch, imported on first use; NotAvailableError saying what needs it."""
    try:
        import torch
    except ImportError:
        raise NotAvailableError(f"{needed_for} needs PyTorch (pip install torch)") from None
    return torch
