"""Unit-test reporting: how many generated inputs the fuzz tests tried, and how many
situations (special files, standard output closed or full, corrupted trees...)."""

from __future__ import annotations

import sys

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    fuzz = sys.modules.get("tests.unit.test_fuzz")
    tried = getattr(fuzz, "TRIED", None)
    if tried and any(tried.values()):
        exits = ", ".join(f"{code}: {n}" for code, n in sorted(fuzz.EXITS.items()))  # type: ignore[union-attr]
        terminalreporter.write_line(
            f"fuzz: {sum(tried.values())} generated inputs tried "
            f"({tried['cli']} command lines, exit statuses {{{exits}}}; "
            f"{tried['library']} library calls)"
        )
    situations = getattr(sys.modules.get("tests.unit.test_situations"), "SITUATIONS", None)
    if situations:
        kinds = ", ".join(f"{kind}: {n}" for kind, n in situations.items())
        terminalreporter.write_line(f"situations: {sum(situations.values())} tried ({kinds})")
