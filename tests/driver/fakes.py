"""In-process fakes of rlinfra's own interfaces for the driver's unit tests: no Ray is started.

``FakeGroup`` stands in for ``WorkerGroup`` with what ``Supervisor`` and ``SupervisedSteps`` use of
it (``name``, ``ranks``, ``world_size``, ``gone_ranks``, ``replace``, ``remove``, ``add``, ``call``,
``node_rank_of``, ``restarts``, ``shutdown``); ``FakeCall`` for ``GroupCall`` (``ranks``,
``issued``, ``wait``, ``subset``); ``FakeSync`` for ``WeightSync`` (``receivers``, ``version``,
``abandon``, ``leave``, ``admit``, ``prepare``, ``commit_version`` and what a trainer restart
calls). The driver's code
does no ``isinstance`` check on any of them: duck typing is enough, and the errors raised are the
real ones (``WorkerGroupError``, ``RestartBudgetExhausted``, ``UnreplaceableError``,
``WeightSyncError``), so the code under test meets what it meets on a cluster.

A worker of a ``FakeGroup`` is one incarnation of a rank. A call captures the incarnation of each
of its ranks when it is issued, as a Ray actor handle does: a call issued to an incarnation that
dies fails for that rank (``gone``), even when the rank has been replaced by the time it is
waited for. Every event that matters to ordering is appended to one shared ``log`` (a list the
test passes to the group, the sync and the rewire hook alike).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlinfra.placement.restart import RestartPolicy
from rlinfra.runtime.errors import RankFailure, WorkerGroupError
from rlinfra.runtime.supervision import (
    FAILED,
    REFUSED,
    REPLACED,
    Restart,
    RestartBudget,
    SupervisionError,
    UnreplaceableError,
)
from rlinfra.services.weights import WeightSyncError


@dataclass(frozen=True)
class Made:
    """What a fake worker returns for a call: who made it, in which incarnation, from what."""

    rank: int
    incarnation: int
    method: str
    args: tuple[Any, ...]


@dataclass
class FakeCall:
    """A pending call on some ranks of a ``FakeGroup`` (stands in for ``GroupCall``).

    ``incarnations`` are the workers the call went to. ``late``: ranks that have not answered yet
    when another rank's failure is reported (``WorkerGroupError.pending``); they answer on the
    next ``wait`` of this call or of its ``subset``."""

    group: FakeGroup
    action: str
    ranks: list[int]
    args: dict[int, tuple[Any, ...]]
    incarnations: dict[int, int]
    late: set[int] = field(default_factory=set)
    issued: float = field(default_factory=time.monotonic)
    waits: int = 0

    def subset(self, ranks: Sequence[int]) -> FakeCall:
        keep = set(ranks)
        chosen = [rank for rank in self.ranks if rank in keep]
        return FakeCall(
            self.group,
            self.action,
            chosen,
            {rank: self.args[rank] for rank in chosen},
            {rank: self.incarnations[rank] for rank in chosen},
            self.late & keep,
            self.issued,  # the same call, issued when it was (as ``GroupCall.subset`` keeps it)
        )

    def wait(self, timeout: float | None = None) -> list[Any]:
        self.waits += 1
        group = self.group
        if group.before_wait is not None:
            group.before_wait(self)
        results: dict[int, Any] = {}
        failures: dict[int, RankFailure] = {}
        for rank in self.ranks:
            incarnation = self.incarnations[rank]
            node = group.node_rank_of(rank)
            if node in group.dead_nodes:
                failures[rank] = RankFailure(rank, node, f"its node {node} was lost", gone=True)
            elif (rank, incarnation) in group.dead:
                failures[rank] = RankFailure(rank, node, "the worker process died", gone=True)
            elif rank in group.raising:
                failures[rank] = RankFailure(rank, node, group.raising[rank])
            elif rank not in self.late:
                results[rank] = group.answer(self.action, rank, incarnation, self.args[rank])
        pending = [rank for rank in self.ranks if rank not in results and rank not in failures]
        self.late.clear()  # late ranks answer by the next wait
        if failures:
            group.log.append(("failed", group.name, self.action, sorted(failures)))
            raise WorkerGroupError(group.name, self.action, failures, results, pending)
        if pending:  # nothing failed: the call simply waits for them
            for rank in pending:
                results[rank] = group.answer(self.action, rank, self.incarnations[rank], self.args[rank])
        return [results[rank] for rank in self.ranks]


class FakeGroup:
    """A worker group of ``size`` ranks (stands in for ``WorkerGroup``); ``nodes`` gives each
    rank's node (default: rank ``r`` on node ``r``). Restart budgets are real ``RestartBudget``s."""

    def __init__(
        self,
        name: str,
        size: int,
        *,
        nodes: Sequence[int] | None = None,
        max_restarts: int = 3,
        log: list[Any] | None = None,
    ) -> None:
        self.name = name
        self.nodes = list(nodes) if nodes is not None else list(range(size))
        assert len(self.nodes) == size
        self.incarnation = dict.fromkeys(range(size), 0)
        self.dead: set[tuple[int, int]] = set()  # (rank, incarnation) whose process died
        self.dead_nodes: set[int] = set()
        self.raising: dict[int, str] = {}  # rank -> the reason its method raises (a bug, not a death)
        self.removed: set[int] = set()
        self.restart_budget = RestartBudget(RestartPolicy(max_restarts=max_restarts, within_s=600))
        self.restarts: list[Restart] = []
        self.calls: list[FakeCall] = []
        self.log: list[Any] = log if log is not None else []
        self.late: set[int] = set()  # ranks the next call reaches late (see ``FakeCall.late``)
        self.before_wait: Callable[[FakeCall], None] | None = None  # runs as a call is waited for
        self.on_replace: Callable[[int], None] | None = None  # runs as a newcomer comes up
        self.replace_error: Callable[[int], BaseException | None] | None = None
        self.shut_down = False

    # --- what the tests do to it
    def kill(self, rank: int) -> None:
        """The rank's current worker dies (its process: gone until replaced)."""
        self.dead.add((rank, self.incarnation[rank]))

    def lose_node(self, node: int) -> None:
        self.dead_nodes.add(node)

    def answer(self, method: str, rank: int, incarnation: int, args: tuple[Any, ...]) -> Made:
        return Made(rank, incarnation, method, args)

    def method(self, name: str) -> FakeMethod:
        """``group.<name>`` as a ``GroupMethod``: called, a call on every rank."""
        return FakeMethod(self, name)

    # --- WorkerGroup's interface
    @property
    def ranks(self) -> list[int]:
        return [rank for rank in range(len(self.nodes)) if rank not in self.removed]

    @property
    def world_size(self) -> int:
        return len(self.nodes)

    def node_rank_of(self, rank: int) -> int | None:
        return self.nodes[rank] if 0 <= rank < len(self.nodes) else None

    def gone_ranks(self, timeout_s: float = 5.0) -> list[int]:
        return [
            rank
            for rank in self.ranks
            if self.nodes[rank] in self.dead_nodes or (rank, self.incarnation[rank]) in self.dead
        ]

    def call(
        self,
        method: str | Callable[..., Any],
        ranks: Sequence[int] | None = None,
        per_rank: Sequence[tuple[Any, ...]] | None = None,
        *,
        args: tuple[Any, ...] = (),
        **_: Any,
    ) -> FakeCall:
        name = method if isinstance(method, str) else method.__name__
        chosen = self.ranks if ranks is None else list(ranks)
        calls = list(per_rank) if per_rank is not None else [args] * len(chosen)
        assert len(calls) == len(chosen)
        call = FakeCall(
            self,
            name,
            chosen,
            dict(zip(chosen, calls, strict=True)),
            {rank: self.incarnation[rank] for rank in chosen},
            self.late & set(chosen),
        )
        self.late -= set(chosen)
        self.calls.append(call)
        self.log.append(("call", self.name, name, tuple(chosen)))
        return call

    def replace(self, rank: int, reason: str = "", *, timeout: float | None = None) -> Restart:
        assert rank in self.ranks, f"{self.name}: replace of rank {rank}, not running"
        node = self.node_rank_of(rank)

        def record(outcome: str, detail: str = "") -> Restart:
            attempt = Restart(self.name, rank, node, reason, time.time(), 0.0, outcome, detail)
            self.restarts.append(attempt)
            return attempt

        try:
            if node in self.dead_nodes:
                raise UnreplaceableError(self.name, rank, node, "its node is gone")
            self.restart_budget.charge(self.name, rank, node)
        except SupervisionError as error:
            record(REFUSED, str(error))
            raise
        error = self.replace_error(rank) if self.replace_error is not None else None
        if error is not None:
            record(FAILED, str(error).splitlines()[0])
            raise error
        self.dead.add((rank, self.incarnation[rank]))  # the old one is killed first
        self.incarnation[rank] += 1
        self.log.append(("replace", self.name, rank))
        if self.on_replace is not None:
            self.on_replace(rank)
        return record(REPLACED)

    def remove(self, ranks: Sequence[int], *, timeout: float | None = None) -> None:
        chosen = sorted(set(ranks))
        assert set(chosen) <= set(self.ranks) and len(chosen) < len(self.ranks)
        for rank in chosen:
            self.dead.add((rank, self.incarnation[rank]))  # killed; its bundle kept for add()
            self.removed.add(rank)
        self.log.append(("remove", self.name, tuple(chosen)))

    def add(self, ranks: Sequence[int], *, timeout: float | None = None) -> None:
        chosen = sorted(set(ranks))
        assert set(chosen) <= self.removed
        for rank in chosen:
            self.incarnation[rank] += 1
            self.removed.discard(rank)
        self.log.append(("add", self.name, tuple(chosen)))

    def shutdown(self) -> None:
        self.shut_down = True
        self.log.append(("shutdown", self.name))

    def __repr__(self) -> str:
        return f"FakeGroup({self.name!r}, ranks={self.ranks})"


@dataclass
class FakeMethod:
    """Stands in for ``GroupMethod``: ``group`` and a call on all of its ranks."""

    group: FakeGroup
    name: str

    def __call__(self, *args: Any) -> FakeCall:
        return self.group.call(self.name, args=args)


@dataclass
class Report:
    """What ``WeightSync.update`` returns, as far as the driver reads it."""

    version: int
    prepare_s: float = 0.0
    pause_s: float = 0.0
    held_s: float = 0.0


class FakeSync:
    """Stands in for ``WeightSync``: records every call in the shared ``log``. ``staged`` is the
    staged version (None: none); ``admit_fails`` makes the next ``admit`` calls fail (each call
    pops one: a callable run first, e.g. to kill the newcomer, and the ranks it fails on)."""

    def __init__(
        self,
        receivers: FakeGroup,
        *,
        version: int = 5,
        staged: int | None = None,
        log: list[Any] | None = None,
    ) -> None:
        self.receivers = receivers
        self.version = version
        self.staged = staged
        self.log: list[Any] = log if log is not None else receivers.log
        self.alive = list(receivers.ranks)
        self.admit_fails: list[Callable[[list[int]], None]] = []
        self.sender: Any = None
        self.updates: list[int] = []

    def abandon(self) -> int | None:
        staged, self.staged = self.staged, None
        self.log.append(("abandon", staged))
        return staged

    def leave(self, ranks: Sequence[int]) -> None:
        self.alive = [rank for rank in self.alive if rank not in set(ranks)]
        self.log.append(("leave", tuple(ranks)))

    def admit(self, ranks: Sequence[int]) -> int:
        newcomers = sorted(set(ranks))
        assert self.staged is None, "admit while a version is staged (WeightSync refuses it)"
        self.log.append(("admit", tuple(newcomers), self.version))
        if self.admit_fails:
            self.admit_fails.pop(0)(newcomers)
            failures = {
                rank: RankFailure(rank, rank, "the worker process died", gone=True) for rank in newcomers
            }
            cause = WorkerGroupError(self.receivers.name, "admission", failures)
            raise WeightSyncError("admit", self.version, self.version, cause)
        self.alive = sorted(set(self.alive) | set(newcomers))
        return self.version

    def prepare(self, version: int) -> Report:
        assert version > self.version
        self.staged = version
        self.log.append(("prepare", version))
        return Report(version)

    def staged_or_prepare(self, version: int) -> Report:
        return Report(version) if self.staged == version else self.prepare(version)

    def commit_version(self, version: int) -> Report:
        if self.staged != version:  # staged again first when a replacement dropped it
            self.prepare(version)
        self.version, self.staged = version, None
        self.log.append(("commit", version))
        return Report(version)

    def replace_sender(self, sender: Any) -> None:
        self.abandon()
        self.sender = sender
        self.log.append(("replace_sender", getattr(sender, "name", sender)))

    def update(self, version: int) -> Report:
        assert version > self.version, f"versions must increase: {version} after {self.version}"
        self.version = version
        self.updates.append(version)
        self.log.append(("update", version))
        return Report(version)


def gone_failure(group: str, ranks: Sequence[int], results: dict[int, Any] | None = None) -> WorkerGroupError:
    """The error a call raises when ``ranks`` of ``group`` died during it."""
    failures = {rank: RankFailure(rank, rank, "the worker process died", gone=True) for rank in ranks}
    return WorkerGroupError(group, "step", failures, results)


def without_noop_leaves(log: list[Any]) -> list[Any]:
    """The log without ``leave(())`` (the supervisor tells the sync that nobody left: no-op)."""
    return [entry for entry in log if entry != ("leave", ())]
