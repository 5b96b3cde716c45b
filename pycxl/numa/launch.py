"""Run a command under a memory policy and CPU binding, named by tiers (numactl-like)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidRequestError
from ..sysfs import Sysfs
from .placement import resolve_nodes
from .policy import Policy, read_weights, set_thread_policy, write_weights


@dataclass(frozen=True)
class LaunchRequest:
    command: tuple[str, ...]
    membind: tuple[str, ...] = ()
    preferred: str | None = None
    interleave: tuple[str, ...] = ()
    weights: tuple[int, ...] = ()
    cpunodebind: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchPlan:
    policy: Policy | None
    cpus: tuple[int, ...]
    weights: dict[int, int]


def plan_launch(req: LaunchRequest, sysroot: str | None = None) -> LaunchPlan:
    """Validate and resolve names before anything runs or changes."""
    if not req.command:
        raise InvalidRequestError("no command given; put it after '--'")
    chosen = [bool(req.membind), req.preferred is not None, bool(req.interleave)]
    if sum(chosen) > 1:
        raise InvalidRequestError("choose one of --membind, --preferred, --interleave")
    if req.weights and not req.interleave:
        raise InvalidRequestError("--weights applies to --interleave")
    policy: Policy | None = None
    weights: dict[int, int] = {}
    if req.membind:
        policy = Policy.bind(*resolve_nodes(req.membind, sysroot))
    elif req.preferred is not None:
        policy = Policy.preferred(*resolve_nodes(req.preferred, sysroot))
    elif req.interleave:
        nodes = resolve_nodes(req.interleave, sysroot)
        if req.weights:
            if len(req.weights) != len(nodes):
                raise InvalidRequestError(
                    f"{len(req.weights)} weight(s) for {len(nodes)} interleave node(s); "
                    "give one weight per node, in the same order"
                )
            read_weights(Sysfs(sysroot))  # the kernel has weighted interleave
            weights = dict(zip(nodes, req.weights, strict=True))
            policy = Policy.weighted_interleave(*nodes)
        else:
            policy = Policy.interleave(*nodes)
    cpus: tuple[int, ...] = ()
    if req.cpunodebind:
        from .nodes import read_nodes

        by_id = {n.id: n for n in read_nodes(Sysfs(sysroot))}
        ids = _node_ids(req.cpunodebind, sysroot)
        cpus = tuple(c for i in ids for c in by_id[i].cpus)
        if not cpus:
            raise InvalidRequestError(
                f"--cpunodebind {','.join(req.cpunodebind)}: those nodes have no CPUs"
            )
    return LaunchPlan(policy, cpus, weights)


def _node_ids(names: Sequence[str], sysroot: str | None) -> list[int]:
    from ..system import snapshot

    system = snapshot(sysroot, gpus=False)
    out = []
    for name in (n for item in names for n in item.split(",")):
        t = system.resolve(name.strip(), initiator=True)
        if t.node is None:
            raise InvalidRequestError(f"'{name}' has no NUMA node")
        out.append(t.node)
    return out


def run(req: LaunchRequest, sysroot: str | None = None) -> int:
    """Run the command under the request's policy; its exit status (128+N on signal N).
    System-wide interleave weights, if set, are restored when it ends."""
    plan = plan_launch(req, sysroot)
    previous = write_weights(plan.weights, Sysfs(sysroot)) if plan.weights else {}

    def in_child() -> None:
        if plan.cpus:
            os.sched_setaffinity(0, plan.cpus)
        if plan.policy is not None:
            set_thread_policy(plan.policy)

    try:
        try:
            proc = subprocess.Popen(list(req.command), preexec_fn=in_child)
        except FileNotFoundError:
            raise InvalidRequestError(
                f"command not found: {req.command[0]} (not on PATH)"
            ) from None
        try:
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            rc = proc.wait()
    finally:
        if previous:
            write_weights(previous, Sysfs(sysroot))
    return 128 - rc if rc < 0 else rc
