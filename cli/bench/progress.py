"""The progress bar a sweep iterates its points through (stderr, never with --json)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

import click

T = TypeVar("T")


def bar(quiet: bool, label: str) -> Callable[[Sequence[T]], Iterable[T]]:
    """What a sweep iterates its points through: a progress bar on stderr, unless quiet
    or only one point."""

    def each(items: Sequence[T]) -> Iterable[T]:
        return items if quiet or len(items) < 2 else _BarIter(items, label)

    return each


class _BarIter(Iterable[T]):
    def __init__(self, items: Sequence[T], label: str) -> None:
        self.items, self.label = items, label

    def __iter__(self) -> Iterator[T]:
        if sys.stderr is None:  # closed: no bar, and never one drawn on stdout instead
            yield from self.items
            return
        with click.progressbar(self.items, label=self.label, file=sys.stderr) as shown:
            yield from shown
