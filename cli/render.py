"""Tables for people, JSON for programs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click
from tabulate import tabulate


def emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2))


def emit_table(title: str | None, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    if title:
        click.echo(click.style(title, bold=True))
    if rows:
        click.echo(tabulate(rows, headers=list(headers), tablefmt="simple", disable_numparse=True))
    else:
        click.echo("  (none)")
    click.echo()


def dash(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)
