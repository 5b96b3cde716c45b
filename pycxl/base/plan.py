"""Plans: every change pycxl makes to the kernel, as ordered steps that can be shown,
executed, and undone.

A step is usually one attribute write with the writes that reverse it. Steps that are
not plain writes (waiting for a device, onlining the memory blocks a device turned out
to have) carry functions instead, and a description for ``--dry-run``.

Executing a plan that fails at any step undoes the steps already done, newest first,
and raises ``PlanFailed`` naming the failed step; if an undo step fails too, the error
says what could not be put back.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from .errors import NeedsRootError, OperationError, PycxlError
from .sysfs import Sysfs

Undo = Callable[[Sysfs], None]


@dataclass(frozen=True)
class Step:
    """One change: ``path <- value`` (a write) or ``action`` (anything else)."""

    description: str
    path: str | None = None
    value: str | None = None
    # Writes that reverse this step, in order; for actions, ``revert``.
    undo_writes: tuple[tuple[str, str], ...] = ()
    action: Callable[[Sysfs], Undo | None] | None = field(default=None, compare=False)

    def show(self) -> str:
        """The step as a person reads it in a dry run."""
        if self.path is None:
            return self.description
        return f"{self.path} <- {self.value!r}  ({self.description})"

    def run(self, fs: Sysfs) -> Undo | None:
        """Do the step; return what reverses it (None: nothing to reverse)."""
        if self.action is not None:
            return self.action(fs)
        assert self.path is not None and self.value is not None
        fs.write(self.path, self.value)
        writes = self.undo_writes
        if not writes:
            return None

        def revert(f: Sysfs) -> None:
            for path, value in writes:
                f.write(path, value)

        return revert


def write(description: str, path: str, value: str, *undo: tuple[str, str]) -> Step:
    """A step that writes ``value`` to ``path``, undone by writing ``undo`` (if any)."""
    return Step(description=description, path=path, value=value, undo_writes=tuple(undo))


def action(description: str, fn: Callable[[Sysfs], Undo | None]) -> Step:
    """A step that runs ``run`` (a wait, a set of writes decided at run time)."""
    return Step(description=description, action=fn)


class PlanFailed(OperationError):
    """A plan step failed; the steps before it were undone (unless ``undo_errors``)."""

    def __init__(self, step: Step, index: int, cause: Exception, undo_errors: list[str]) -> None:
        self.step = step
        self.index = index
        self.cause = cause
        self.undo_errors = undo_errors
        msg = f"step {index + 1} ({step.description}) failed: {cause}"
        if undo_errors:
            msg += "; could NOT undo: " + "; ".join(undo_errors)
        elif index:
            msg += f"; the {index} step(s) before it were undone"
        super().__init__(msg)


StepHook = Callable[[int, Step], None]


@dataclass(frozen=True)
class Plan:
    """Ordered steps toward one goal (``title``, as a person reads it); ``action``: the
    goal's verb for programs (create, enable, disable, destroy...), never parsed back
    out of the title."""

    title: str
    steps: tuple[Step, ...]
    action: str | None = None

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def show(self) -> list[str]:
        """The steps as numbered lines, for --dry-run."""
        return [f"{i + 1:2d}. {s.show()}" for i, s in enumerate(self.steps)]

    def execute(self, fs: Sysfs, *, before_step: StepHook | None = None) -> None:
        """Run every step; on failure undo the done ones and raise ``PlanFailed``.

        Refused with ``NeedsRootError`` before any step where the live kernel is written
        by another user than root. ``before_step(index, step)`` is called before each
        step (progress, logging); an exception it raises counts as that step's failure.
        """
        if self.steps:
            require_root(fs, self.title)
        done: list[tuple[Step, Undo | None]] = []
        for i, step in enumerate(self.steps):
            try:
                if before_step is not None:
                    before_step(i, step)
                done.append((step, step.run(fs)))
            except (PycxlError, OSError) as e:
                raise PlanFailed(step, i, e, undo(done, fs)) from e


def require_root(fs: Sysfs, what: str) -> None:
    """Writes to the live kernel need root, found before the first one (a write refused
    half-way would read as a failed step, exit 1); a recorded tree does not."""
    if fs.root == os.sep and os.geteuid() != 0:
        raise NeedsRootError(f"{what} writes to the kernel; run it as root (sudo)")


def undo(done: Sequence[tuple[Step, Undo | None]], fs: Sysfs) -> list[str]:
    """Reverse done steps newest first; return what could not be reversed."""
    errors = []
    for step, revert in reversed(done):
        if revert is None:
            continue
        try:
            revert(fs)
        except (PycxlError, OSError) as e:
            errors.append(f"{step.description}: {e}")
    return errors
