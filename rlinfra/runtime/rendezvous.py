"""Rendezvous, driver side: torch.distributed process groups over launched worker groups.

``bring_up`` / ``tear_down`` make and drop every rank's default process group, and
``bring_up_cross`` / ``tear_down_cross`` named groups spanning components (trainer rank 0 + every
rollout worker, to broadcast weights). The workers do their part in
``rlinfra.runtime.process_groups`` (rank 0 hands its held port's socket to torch, so no port is
probed then bound), reached through ``WorkerGroup.call`` on ``HostMethods``. Every wait has a
deadline, and a rank that fails or dies mid-rendezvous becomes a ``WorkerGroupError`` naming it,
in seconds, while its peers are still blocked in the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlinfra.runtime import process_groups
from rlinfra.runtime.calls import GroupCall, wait_all
from rlinfra.runtime.deadline import Deadline
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.hosting import HostMethods
from rlinfra.runtime.process_groups import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from rlinfra.runtime.group import WorkerGroup

# The driver waits this much longer than the workers' own torch timeout, so that a rank's own
# error (naming what it waited for) wins over a bare "no answer" from the driver.
DRIVER_MARGIN_S = 3.0

Member = tuple["WorkerGroup", tuple[int, ...]]  # a worker group and some of its ranks


def bring_up(group: WorkerGroup, backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Make the default torch process group on every rank of ``group``.

    Returns when all ranks are in; a rank that raises or dies meanwhile becomes a
    ``WorkerGroupError`` naming it as soon as it happens, while its peers still wait in the store.
    After a failure, ``bring_up`` may be called again once the others have timed out, or the group
    shut down.
    """
    deadline = Deadline.after(timeout_s + DRIVER_MARGIN_S)
    group.refresh_master_address(deadline.left())  # a fresh held port if a previous run consumed it
    init = (process_groups.init_process_group, backend, timeout_s)
    group.call(HostMethods.rlinfra_run, args=init, action="joining the process group").wait(deadline.left())


def tear_down(group: WorkerGroup, timeout_s: float = 30.0) -> None:
    """Destroy every rank's default process group; rank 0 then holds a fresh ``MASTER_PORT`` again,
    so the group is as ``launch`` left it."""
    deadline = Deadline.after(timeout_s)
    destroy = (process_groups.destroy_process_group,)
    destroying = group.call(HostMethods.rlinfra_run, args=destroy, action="destroying the process group")
    destroying.wait(deadline.left())
    group.refresh_master_address(deadline.left())


@dataclass(frozen=True)
class CrossGroupInfo:
    """What the driver knows of a cross group it brought up (pass it to ``tear_down_cross``);
    ``cross_ranks`` maps (worker group name, rank) to the member's cross rank."""

    name: str
    address: str
    port: int
    world_size: int
    backend: str
    cross_ranks: Mapping[tuple[str, int], int]
    _groups: tuple[Member, ...] = field(repr=False, compare=False)


def _ordered_members(name: str, members: Sequence[tuple[WorkerGroup, Sequence[int]]]) -> tuple[Member, ...]:
    """Members in cross-rank order (given group order, then ascending rank), checked: every
    participant derives the same ranks from it, so the rendezvous cannot deadlock on an order."""
    if not members:
        raise ValueError(f"cross group {name!r} needs at least one member")
    ordered: list[Member] = []
    seen: set[tuple[int, int]] = set()
    for group, ranks in members:
        chosen = tuple(sorted(ranks))
        out_of_range = [rank for rank in chosen if not 0 <= rank < len(group.actors)]
        repeated = sorted({rank for rank in chosen if chosen.count(rank) > 1 or (id(group), rank) in seen})
        if out_of_range or repeated or not chosen:
            raise ValueError(
                f"cross group {name!r}: worker group {group.name!r} has launched ranks "
                f"0-{len(group.actors) - 1}; cannot take ranks {list(ranks)} (out of range: "
                f"{out_of_range}, repeated: {repeated})"
            )
        seen.update((id(group), rank) for rank in chosen)
        ordered.append((group, chosen))
    return tuple(ordered)


def bring_up_cross(
    name: str,
    members: Sequence[tuple[WorkerGroup, Sequence[int]]],
    backend: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> CrossGroupInfo:
    """Make cross group ``name`` over ``members`` — ``[(trainer, [0]), (rollout, rollout.ranks)]`` —
    and return who got which cross rank. Workers reach it with ``cross_group(name)``.

    Cross rank 0 (the first member's lowest rank) serves the store on a port it holds from before
    anyone is told of it. Every join is issued before any is awaited (each blocks until all joined),
    and a member that fails or dies raises ``WorkerGroupError`` naming it at once, whichever worker
    group it is in. Mixed CPU/GPU members should pass ``backend``: each member picks its own default.
    The joins get ``timeout_s`` (plus the driver's margin) from when they are issued.
    """
    ordered = _ordered_members(name, members)
    first, first_ranks = ordered[0]
    reserve, action = (process_groups.reserve_cross_port, name), f"reserving a port for cross group {name!r}"
    reserving = first.call(HostMethods.rlinfra_run, first_ranks[:1], args=reserve, action=action)
    address, port = reserving.wait(timeout_s + DRIVER_MARGIN_S)[0]
    in_order = [(group.name, rank) for group, ranks in ordered for rank in ranks]
    cross_ranks = {member: cross_rank for cross_rank, member in enumerate(in_order)}
    world_size = len(cross_ranks)
    # Every join is sent before any is waited on.
    join, action = (process_groups.join_cross_group, name, address, port), f"joining cross group {name!r}"
    calls: list[GroupCall] = []
    for group, ranks in ordered:
        joins = [(*join, cross_ranks[group.name, rank], world_size, backend, timeout_s) for rank in ranks]
        calls.append(group.call(HostMethods.rlinfra_run, ranks, joins, action=action))
    try:
        backends = wait_all(calls, timeout_s + DRIVER_MARGIN_S)
    except WorkerGroupError:
        _leave_later(name, ordered)
        raise
    return CrossGroupInfo(name, address, port, world_size, backends[0][0], cross_ranks, ordered)


def tear_down_cross(info: CrossGroupInfo, timeout_s: float = 30.0) -> None:
    """Every member leaves cross group ``info.name``."""
    leave, action = (process_groups.leave_cross_group, info.name), f"leaving cross group {info.name!r}"
    calls = [
        group.call(HostMethods.rlinfra_run, ranks, args=leave, action=action) for group, ranks in info._groups
    ]
    wait_all(calls, timeout_s)


def _leave_later(name: str, ordered: Sequence[Member]) -> None:
    """After a failed bring-up, queue a leave on every member without waiting: members still
    blocked in the rendezvous run it once their own timeout frees them, which drops a half-made
    group and the held port."""
    for group, ranks in ordered:
        with contextlib.suppress(Exception):  # a dead member has nothing to clean up
            group.call(HostMethods.rlinfra_run, ranks, args=(process_groups.leave_cross_group, name))
