"""Rendezvous: torch.distributed process groups over a launched ``WorkerGroup``, without port races.

After ``launch`` every rank knows ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``, and
rank 0 holds a bound, listening socket on ``MASTER_PORT`` (``hold_port``). Rank 0 hands that very
socket to torch's ``TCPStore`` (``master_listen_fd``), so the port is never released and re-bound:
no other process on the node can take it in between, unlike the usual probe-a-free-port-then-bind.

Two halves, one module:

- worker side (call inside a worker method, or let rlinfra's host methods call them):
  ``init_process_group`` / ``destroy_process_group`` for the group's default process group, and
  ``join_cross_group`` / ``cross_group`` / ``leave_cross_group`` for named groups spanning
  components (trainer rank 0 + every rollout worker, to broadcast weights), kept apart from the
  default group because torch allows one default group per process;
- driver side: ``bring_up`` / ``tear_down`` and ``bring_up_cross`` / ``tear_down_cross``, which wait
  with deadlines and turn a rank that fails or dies mid-rendezvous into a ``WorkerGroupError`` naming
  it, in seconds, while its peers are still blocked in the store.

torch is optional (``pip install rlinfra[torch]``): it is imported only when a process group is made.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import ray

from rlinfra.runtime.calls import FAILURE_GRACE_S, GroupCall
from rlinfra.runtime.errors import RankFailure, WorkerGroupError

if TYPE_CHECKING:
    from rlinfra.runtime.group import WorkerGroup

DEFAULT_TIMEOUT_S = 60.0
# The driver waits this much longer than the workers' own torch timeout, so that a rank's own
# error (naming what it waited for) wins over a bare "no answer" from the driver.
DRIVER_MARGIN_S = 3.0
_LISTEN_BACKLOG = 128

Member = tuple["WorkerGroup", tuple[int, ...]]  # a worker group and some of its ranks

# One hosted worker per actor process, so these are process state: the worker-side functions are
# plain functions called from user code, and find what they need here.
_HELD: dict[int, socket.socket] = {}  # port → listening socket not yet handed to torch
_CROSS_PORTS: dict[str, int] = {}  # cross group name → the port reserved for it in this process
_CROSS_GROUPS: dict[str, CrossGroup] = {}  # cross groups this process has joined


# ------------------------------------------------------------------------------------ held ports
def hold_port() -> int:
    """Bind a free port on this node and keep listening on it until torch takes it over
    (``init_process_group``/``join_cross_group``) or ``release_port``. Connections that arrive
    early wait in the backlog instead of being refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("", 0))
    sock.listen(_LISTEN_BACKLOG)
    port = sock.getsockname()[1]
    _HELD[port] = sock
    return port


def holds_port(port: int | None) -> bool:
    return port in _HELD


def release_port(port: int | None) -> None:
    """Close the socket holding ``port``, if this process still holds it."""
    sock = _HELD.pop(port, None) if port is not None else None
    if sock is not None:
        sock.close()


# ----------------------------------------------------------------------------- worker side
def _require_torch() -> Any:
    try:
        import torch
        import torch.distributed
    except ImportError as error:
        raise ImportError(
            "rlinfra's rendezvous needs torch.distributed: pip install rlinfra[torch]"
        ) from error
    return torch


def default_backend() -> str:
    """``nccl`` where this process sees a CUDA device, else ``gloo``."""
    return "nccl" if _require_torch().cuda.is_available() else "gloo"


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(
            f"{name} is not set: init_process_group runs inside a worker launched by a WorkerGroup, "
            "which sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
        )
    return value


def _env_int(name: str) -> int:
    value = _env(name)
    try:
        return int(value)
    except ValueError:
        raise RuntimeError(f"{name}={value!r} is not an integer") from None


def _tcp_store(address: str, port: int, rank: int, world_size: int, timeout: timedelta) -> Any:
    """The store every rank of a rendezvous meets in; rank 0 serves it on its held socket.

    torch owns a ``master_listen_fd`` once passed, and closes it even when the constructor raises
    (measured with torch 2.13, libuv and legacy servers alike): so the socket is detached, not
    closed, and the port goes straight from our listener to torch's. Without a held socket (a
    rendezvous outside rlinfra), rank 0 binds the port itself.
    """
    dist = _require_torch().distributed
    if rank != 0:
        return dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
    held = _HELD.pop(port, None)
    return dist.TCPStore(
        address,
        port,
        world_size,
        is_master=True,
        timeout=timeout,
        wait_for_workers=True,
        master_listen_fd=held.detach() if held is not None else None,
    )


def init_process_group(backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Make this worker's default torch process group from the env ``launch`` set, and return the
    backend used (default: ``nccl`` with CUDA, else ``gloo``). Every rank must call it; each blocks
    until all have joined or ``timeout_s`` passes."""
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    address, port = _env("MASTER_ADDR"), _env_int("MASTER_PORT")
    torch = _require_torch()
    backend = backend or default_backend()
    timeout = timedelta(seconds=timeout_s)
    store = _tcp_store(address, port, rank, world_size, timeout)
    torch.distributed.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timeout
    )
    return backend


def destroy_process_group() -> None:
    """Tear down this worker's default process group (and with it rank 0's store and port)."""
    dist = _require_torch().distributed
    if dist.is_initialized():
        dist.destroy_process_group()


@dataclass
class CrossGroup:
    """This process's membership of a named cross-component group: collectives on a process group
    object of its own, never the default group (torch keeps one default group per process)."""

    name: str
    rank: int
    world_size: int
    backend: str
    process_group: Any = field(repr=False)
    store: Any = field(repr=False)  # kept alive: on rank 0 it is the server the others met at

    def broadcast(self, tensor: Any, src: int) -> Any:
        """Broadcast ``tensor`` in place from cross rank ``src``; returns it."""
        options = _require_torch().distributed.BroadcastOptions()
        options.rootRank = src
        self.process_group.broadcast([tensor], options).wait()
        return tensor

    def all_reduce(self, tensor: Any, op: Any = None) -> Any:
        """Reduce ``tensor`` in place over every member (default: sum); returns it."""
        dist = _require_torch().distributed
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.SUM if op is None else op
        self.process_group.allreduce([tensor], options).wait()
        return tensor

    def barrier(self) -> None:
        self.process_group.barrier().wait()


def reserve_cross_port(name: str) -> int:
    """Hold a port for cross group ``name`` here (its rank 0); asking twice gives the same port."""
    if name in _CROSS_GROUPS:
        raise RuntimeError(f"this process is already in cross group {name!r}: leave it first")
    port = _CROSS_PORTS.get(name)
    if not holds_port(port):
        port = _CROSS_PORTS[name] = hold_port()
    return port


def _new_backend(backend: str, store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
    dist = _require_torch().distributed
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    if backend == "nccl":
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None:
            raise RuntimeError("this torch build has no NCCL: use backend='gloo' for this cross group")
        options = nccl.Options()
        options._timeout = timeout
        return nccl(store, rank, world_size, options)
    raise ValueError(f"cross groups support the 'gloo' and 'nccl' backends, not {backend!r}")


def join_cross_group(
    name: str,
    address: str,
    port: int,
    rank: int,
    world_size: int,
    backend: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> CrossGroup:
    """Join cross group ``name`` as ``rank`` of ``world_size``; blocks until every member joined
    (gloo connects at once; nccl connects at the first collective). Rank 0 serves the store on the
    port ``reserve_cross_port`` holds."""
    if name in _CROSS_GROUPS:
        raise RuntimeError(f"this process is already in cross group {name!r}: leave it first")
    backend = backend or default_backend()
    timeout = timedelta(seconds=timeout_s)
    store = _tcp_store(address, port, rank, world_size, timeout)
    process_group = _new_backend(backend, store, rank, world_size, timeout)
    _CROSS_PORTS.pop(name, None)
    joined = _CROSS_GROUPS[name] = CrossGroup(name, rank, world_size, backend, process_group, store)
    return joined


def cross_group(name: str) -> CrossGroup:
    """This process's membership of cross group ``name`` (joined through ``bring_up_cross``)."""
    joined = _CROSS_GROUPS.get(name)
    if joined is None:
        known = ", ".join(sorted(_CROSS_GROUPS)) or "none"
        raise KeyError(f"this process is not in cross group {name!r} (joined: {known})")
    return joined


def leave_cross_group(name: str) -> None:
    """Leave cross group ``name`` and free its port; leaving a group not joined does nothing, so a
    driver may clean up after a failed bring-up without knowing who got how far."""
    release_port(_CROSS_PORTS.pop(name, None))
    joined = _CROSS_GROUPS.pop(name, None)
    if joined is not None:
        with contextlib.suppress(Exception):  # a backend without shutdown is freed with its object
            joined.process_group.shutdown()


# ----------------------------------------------------------------------------- driver side
def bring_up(group: WorkerGroup, backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Make the default torch process group on every rank of ``group``.

    Returns when all ranks are in; a rank that raises or dies meanwhile becomes a
    ``WorkerGroupError`` naming it as soon as it happens, while its peers still wait in the store.
    After a failure, ``bring_up`` may be called again once the others have timed out, or the group
    shut down.
    """
    deadline = time.monotonic() + timeout_s + DRIVER_MARGIN_S
    group._publish_master_address(deadline)  # a fresh held port if a previous run consumed it
    refs = [actor._rlinfra_init_distributed.remote(backend, timeout_s) for actor in group.actors]
    group._call("joining the process group", refs, group.ranks).wait(_remaining(deadline))


def tear_down(group: WorkerGroup, timeout_s: float = 30.0) -> None:
    """Destroy every rank's default process group; rank 0 then holds a fresh ``MASTER_PORT`` again,
    so the group is as ``launch`` left it."""
    deadline = time.monotonic() + timeout_s
    refs = [actor._rlinfra_destroy_distributed.remote() for actor in group.actors]
    group._call("destroying the process group", refs, group.ranks).wait(_remaining(deadline))
    group._publish_master_address(deadline)


@dataclass(frozen=True)
class CrossMember:
    """One participant of a cross group: its worker group, its rank there and its cross rank."""

    group: str
    rank: int
    cross_rank: int


@dataclass(frozen=True)
class CrossGroupInfo:
    """What the driver knows of a cross group it brought up (pass it to ``tear_down_cross``)."""

    name: str
    address: str
    port: int
    world_size: int
    backend: str
    members: tuple[CrossMember, ...]
    _groups: tuple[Member, ...] = field(repr=False, compare=False)

    def rank_of(self, group: str, rank: int) -> int:
        """The cross rank of ``rank`` of worker group ``group``."""
        for member in self.members:
            if (member.group, member.rank) == (group, rank):
                return member.cross_rank
        raise KeyError(f"rank {rank} of {group!r} is not in cross group {self.name!r}")


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
    """
    ordered = _ordered_members(name, members)
    deadline = time.monotonic() + timeout_s + DRIVER_MARGIN_S
    first, first_ranks = ordered[0]
    ref = first.actors[first_ranks[0]]._rlinfra_reserve_cross_port.remote(name)
    reserving = first._call(f"reserving a port for cross group {name!r}", [ref], [first_ranks[0]])
    address, port = reserving.wait(_remaining(deadline))[0]
    calls, cross_members = _issue_joins(name, ordered, address, port, backend, timeout_s)
    try:
        backends = _wait_all(calls, deadline, timeout_s + DRIVER_MARGIN_S)
    except WorkerGroupError:
        _leave_later(name, ordered)
        raise
    return CrossGroupInfo(name, address, port, len(cross_members), backends[0][0], cross_members, ordered)


def _issue_joins(
    name: str,
    ordered: Sequence[Member],
    address: str,
    port: int,
    backend: str | None,
    timeout_s: float,
) -> tuple[list[tuple[Member, GroupCall]], tuple[CrossMember, ...]]:
    """Send every member its join (cross ranks counted in member order) without waiting on any."""
    world_size = sum(len(ranks) for _, ranks in ordered)
    calls, cross_members = [], []
    for group, ranks in ordered:
        refs = []
        for rank in ranks:
            cross = len(cross_members)
            cross_members.append(CrossMember(group.name, rank, cross))
            join = group.actors[rank]._rlinfra_join_cross_group
            refs.append(join.remote(name, address, port, cross, world_size, backend, timeout_s))
        calls.append(((group, ranks), group._call(f"joining cross group {name!r}", refs, list(ranks))))
    return calls, tuple(cross_members)


def tear_down_cross(info: CrossGroupInfo, timeout_s: float = 30.0) -> None:
    """Every member leaves cross group ``info.name``."""
    deadline = time.monotonic() + timeout_s
    calls = []
    for group, ranks in info._groups:
        refs = [group.actors[rank]._rlinfra_leave_cross_group.remote(info.name) for rank in ranks]
        calls.append(((group, ranks), group._call(f"leaving cross group {info.name!r}", refs, list(ranks))))
    _wait_all(calls, deadline, timeout_s)


def _leave_later(name: str, ordered: Sequence[Member]) -> None:
    """After a failed bring-up, queue a leave on every member without waiting: members still
    blocked in the rendezvous run it once their own timeout frees them, which drops a half-made
    group and the held port."""
    for group, ranks in ordered:
        for rank in ranks:
            with contextlib.suppress(Exception):  # a dead member has nothing to clean up
                group.actors[rank]._rlinfra_leave_cross_group.remote(name)


def _wait_all(calls: list[tuple[Member, GroupCall]], deadline: float, limit: float) -> list[list[Any]]:
    """Each call's results, raising ``WorkerGroupError`` at the first failure in any of them:
    waiting call by call would hold one group's error back until another's timeout."""
    owner = {ref: call for _, call in calls for ref in call.refs}
    pending = list(owner)
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _raise_late(calls, set(pending), limit)
        ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
        failed = next((owner[ref] for ref in ready if _raised(ref)), None)
        if failed is not None:
            failed.wait(timeout=FAILURE_GRACE_S)  # raises, naming the rank and its traceback
    return [call.wait(timeout=FAILURE_GRACE_S) for _, call in calls]


def _raised(ref: Any) -> bool:
    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayError:
        return True
    return False


def _raise_late(calls: list[tuple[Member, GroupCall]], pending: set[Any], limit: float) -> None:
    """The deadline passed: name the first member group's ranks that never answered."""
    (group, _), call = next(item for item in calls if pending.intersection(item[1].refs))
    late = [rank for ref, rank in zip(call.refs, call.ranks, strict=True) if ref in pending]
    reason = f"no answer within {limit:g} s (still running)"
    failures = {rank: RankFailure(rank, group.node_rank_of(rank), reason) for rank in late}
    raise WorkerGroupError(call.group_name, call.action, failures)


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())
