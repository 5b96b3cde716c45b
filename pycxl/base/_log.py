"""Loggers for the few modules that log. The command line asks for its stderr format
(``pycxl: message``) once, and it is set up when the first module that logs is loaded,
so that a command that loads none (list, check) does not import logging at all."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging

_asked: int | None = None  # the level the command line asked for, until it is set up


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``, after the command line's set-up if it asked for one."""
    import logging

    _set_up()
    return logging.getLogger(name)


def log_to_stderr(verbose: bool) -> None:
    """For the command line: messages to stderr, INFO and above with ``verbose``, else
    WARNING and above; set up now if logging is loaded already, else when first used."""
    global _asked
    _asked = 20 if verbose else 30  # logging.INFO, logging.WARNING
    if verbose or "logging" in sys.modules:
        _set_up()


def _set_up() -> None:
    global _asked
    if _asked is None:
        return
    import logging

    logging.basicConfig(level=_asked, format="pycxl: %(message)s", stream=sys.stderr)
    _asked = None
