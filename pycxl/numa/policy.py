"""Memory policies (set_mempolicy / mbind / get_mempolicy through ``numa.libnuma``).

A ``Policy`` says where pages of new allocations go: ``bind`` (only these nodes),
``preferred`` (this node first), ``interleave`` (round robin), ``weighted_interleave``
(round robin by the per-node weights in /sys/kernel/mm/mempolicy/weighted_interleave,
Linux 6.9+), ``local`` (the faulting CPU's node) or ``default``. It applies to the
calling thread (``thread_policy``, a context manager that restores the previous one) or
to a range of memory (``bind_range``).
"""

from __future__ import annotations

import enum
import errno
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from ..base.errors import InvalidRequestError, NotAvailableError, OperationError
from ..base.plan import Plan, Step, write
from ..base.sysfs import Sysfs
from . import libnuma

WEIGHTS_DIR = "/sys/kernel/mm/mempolicy/weighted_interleave"
# Linux 6.16+: 'true' while the kernel derives the weights from the platform's bandwidth
# figures (HMAT, CDAT); writing a node's weight turns it to 'false'. Linux 6.18.44 shows
# the file as '__auto_type' (seen on this project's test machine: the kernel's own
# '#define auto __auto_type' reaches the attribute's name).
WEIGHTS_AUTO_NAMES = ("auto", "__auto_type")
MAX_WEIGHT = 255

MPOL_F_NODE = 1 << 0  # get_mempolicy: return the node of the page at addr
MPOL_F_ADDR = 1 << 1  # get_mempolicy: policy of the range at addr
MPOL_MF_STRICT = 1 << 0  # mbind: fail if pages do not follow the policy
MPOL_MF_MOVE = 1 << 1  # mbind / move_pages: move pages used only by this process


class Mode(enum.IntEnum):
    DEFAULT = 0
    PREFERRED = 1
    BIND = 2
    INTERLEAVE = 3
    LOCAL = 4
    PREFERRED_MANY = 5
    WEIGHTED_INTERLEAVE = 6


@dataclass(frozen=True)
class Policy:
    mode: Mode
    nodes: tuple[int, ...] = ()

    def __post_init__(self) -> None:  # made directly, not by the class methods: checked too
        try:
            object.__setattr__(self, "mode", Mode(self.mode))
        except (ValueError, TypeError):
            names = ", ".join(m.name.lower() for m in Mode)
            raise InvalidRequestError(f"policy mode {self.mode!r}: use one of {names}") from None
        if not isinstance(self.nodes, tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in self.nodes
        ):  # fmt: skip
            raise InvalidRequestError(f"policy nodes {self.nodes!r}: give node ids, such as (0, 1)")

    @classmethod
    def bind(cls, *nodes: int) -> Policy:
        """Allocate only on ``nodes``."""
        return cls(Mode.BIND, _nodes(nodes, "bind"))

    @classmethod
    def preferred(cls, node: int) -> Policy:
        """Allocate on ``node`` first, then elsewhere."""
        return cls(Mode.PREFERRED, (node,))

    @classmethod
    def preferred_many(cls, *nodes: int) -> Policy:
        """Allocate on any of ``nodes`` first, then elsewhere (Linux 5.15+)."""
        return cls(Mode.PREFERRED_MANY, _nodes(nodes, "preferred-many"))

    @classmethod
    def interleave(cls, *nodes: int) -> Policy:
        """Allocate page by page round robin over ``nodes``."""
        return cls(Mode.INTERLEAVE, _nodes(nodes, "interleave"))

    @classmethod
    def weighted_interleave(cls, *nodes: int) -> Policy:
        """Round robin over ``nodes`` by the system-wide weights (Linux 6.9+)."""
        return cls(Mode.WEIGHTED_INTERLEAVE, _nodes(nodes, "weighted interleave"))

    @classmethod
    def local(cls) -> Policy:
        """Allocate on the node of the CPU that faults."""
        return cls(Mode.LOCAL)

    @classmethod
    def default(cls) -> Policy:
        """The process's default policy (no policy)."""
        return cls(Mode.DEFAULT)

    def describe(self) -> str:
        """The policy in words ('bind 1', 'interleave 0,1')."""
        name = self.mode.name.lower()
        return f"{name} {','.join(map(str, self.nodes))}" if self.nodes else name


def _nodes(nodes: Sequence[int], what: str) -> tuple[int, ...]:
    """Node ids, each once: one named twice is one, as in every list (numactl's too)."""
    if not nodes:
        raise InvalidRequestError(f"a {what} policy needs at least one node")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in nodes):
        raise InvalidRequestError(f"{what} policy nodes {list(nodes)!r}: give node ids, such as "
                                  "(0, 1)")  # fmt: skip
    return tuple(dict.fromkeys(nodes))


def _refused(call: str, policy: Policy, err: int) -> OperationError:
    why = os.strerror(err)
    hint = ""
    if err == errno.EINVAL and policy.mode == Mode.WEIGHTED_INTERLEAVE:
        hint = "; weighted interleave needs Linux 6.9+"
    elif err == errno.EINVAL and policy.mode == Mode.PREFERRED_MANY:
        hint = "; preferred-many needs Linux 5.15+"
    elif err == errno.EINVAL:
        hint = "; a node may be offline or have no memory"
    return OperationError(f"the kernel refused {call}({policy.describe()}): {why}{hint}")


def set_thread_policy(policy: Policy) -> None:
    """Set the calling thread's policy (inherited by threads and processes it starts)."""
    err = libnuma.set_mempolicy(int(policy.mode), policy.nodes)
    if err:
        raise _refused("set_mempolicy", policy, err)


def get_thread_policy() -> Policy:
    """The calling thread's memory policy."""
    mode, nodes = libnuma.get_mempolicy()
    return Policy(Mode(mode & 0xFFFF), nodes)  # high bits: mode flags


@contextmanager
def thread_policy(policy: Policy) -> Iterator[Policy]:
    """Allocations by this thread inside the block follow ``policy``."""
    previous = get_thread_policy()
    set_thread_policy(policy)
    try:
        yield policy
    finally:
        set_thread_policy(previous)


def bind_range(address: int, length: int, policy: Policy, *, move: bool = False) -> None:
    """Apply ``policy`` to [address, address+length) (page aligned); with ``move``,
    pages already there are migrated to follow it."""
    flags = MPOL_MF_MOVE | MPOL_MF_STRICT if move else 0
    err = libnuma.mbind(address, length, int(policy.mode), policy.nodes, flags)
    if err:
        raise _refused("mbind", policy, err)


# --- weighted interleave weights (system-wide) -----------------------------------------
def read_weights(fs: Sysfs | None = None) -> dict[int, int]:
    """The system-wide weighted-interleave weight of each node (Linux 6.9+)."""
    fs = fs or Sysfs()
    if not fs.is_dir(WEIGHTS_DIR):
        raise NotAvailableError(
            f"this kernel has no weighted interleave ({WEIGHTS_DIR} is missing; Linux 6.9+)"
        )
    out = {}
    for entry in fs.listdir(WEIGHTS_DIR):
        if entry.startswith("node") and entry[4:].isdecimal():
            out[int(entry[4:])] = fs.read_int(f"{WEIGHTS_DIR}/{entry}") or 1
    return out


def weights_auto_path(fs: Sysfs) -> str | None:
    """The auto-mode file, under whichever name the kernel gives it; None: no auto mode."""
    return next((p for n in WEIGHTS_AUTO_NAMES if fs.exists(p := f"{WEIGHTS_DIR}/{n}")), None)


def read_weight_mode(fs: Sysfs | None = None) -> str | None:
    """'auto' (the kernel derives the weights, Linux 6.16+), 'manual', or None where the
    kernel has no weighted interleave."""
    fs = fs or Sysfs()
    if not fs.is_dir(WEIGHTS_DIR):
        return None
    auto = weights_auto_path(fs)
    text = (fs.read(auto) or "").strip().lower() if auto else ""
    return "auto" if text in ("true", "1", "y") else "manual"


def weights_plan(weights: dict[int, int], fs: Sysfs | None = None) -> Plan:
    """The steps that set per-node weights (1..255) that differ from the present ones,
    each undone by writing the previous weight back. Where the kernel's auto mode is on,
    the first step turns it off, said in words (writing a weight would turn it off
    anyway, silently); its undo turns it back on."""
    fs = fs or Sysfs()
    previous = read_weights(fs)
    for node, w in weights.items():
        if not 1 <= w <= MAX_WEIGHT:
            raise InvalidRequestError(f"weight {w} for node {node} is not in 1..{MAX_WEIGHT}")
        if node not in previous:
            raise InvalidRequestError(f"node {node} has no weighted-interleave weight")
    steps: list[Step] = []
    auto = weights_auto_path(fs)
    if auto is not None and read_weight_mode(fs) == "auto":
        steps.append(write("turn the kernel's auto weights (from HMAT/CDAT) off",
                           auto, "false", (auto, "true")))  # fmt: skip
    for node, w in sorted(weights.items()):
        path = f"{WEIGHTS_DIR}/node{node}"
        if w != previous[node]:  # an unchanged weight is no step
            steps.append(write(f"node {node}: weight {previous[node]} -> {w}", path, str(w),
                               (path, str(previous[node]))))  # fmt: skip
    return Plan("set weighted-interleave weights", tuple(steps))


def auto_weights_plan(fs: Sysfs | None = None) -> Plan:
    """The step that gives the weights back to the kernel (auto mode, Linux 6.16+)."""
    fs = fs or Sysfs()
    mode = read_weight_mode(fs)
    if mode is None:
        raise NotAvailableError(
            f"this kernel has no weighted interleave ({WEIGHTS_DIR} is missing; Linux 6.9+)"
        )
    auto = weights_auto_path(fs)
    if auto is None:
        raise NotAvailableError(
            "this kernel has no auto weights (Linux 6.16+): its weights are set by hand only"
        )
    steps = () if mode == "auto" else (
        write("let the kernel derive the weights from HMAT/CDAT (auto)", auto, "true",
              (auto, "false")),
    )  # fmt: skip
    return Plan("auto weighted-interleave weights", steps)


def write_weights(weights: dict[int, int], fs: Sysfs | None = None) -> dict[int, int]:
    """Set per-node weights (1..255), through ``weights_plan`` (auto mode is turned off,
    as the plan says); returns the previous ones, to restore."""
    fs = fs or Sysfs()
    previous = read_weights(fs)
    weights_plan(weights, fs).execute(fs)
    return {n: previous[n] for n in weights}
