"""Waiting on a fan-out: results in rank order, failures surfaced as soon as one rank fails.

``ray.get(refs)`` returns only when *every* ref is done, so a rank that dies while its peers block
in a collective leaves the driver hanging until an NCCL/gloo timeout. ``GroupCall.wait`` instead
watches the refs as they complete and raises ``WorkerGroupError`` at the first failure, naming the
rank, its node and the remote traceback, with the results of the ranks that did finish.
``wait_all`` does the same for several calls (several groups) under one deadline.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import ActorUnavailableError, OutOfMemoryError, RayActorError, RayError, RayTaskError

from rlinfra.runtime.deadline import Deadline
from rlinfra.runtime.errors import STUCK, RankFailure, WorkerGroupError
from rlinfra.runtime.hosting import EXIT_NOTE
from rlinfra.runtime.stacks import run_on_node, session_logs_dir
from rlinfra.runtime.watchdog import StuckWatch

if TYPE_CHECKING:
    from rlinfra.runtime.group import WorkerGroup

FAILURE_GRACE_S = 0.5


class Default:
    """The type of ``DEFAULT``: "the group's setting", where None already means "none"."""


DEFAULT = Default()
# Ray declares a node dead after its health checks fail (about 1.5 s in rlinfra's embedded Ray,
# 15 s with Ray's defaults); an unreachable worker waits this long for that verdict.
NODE_VERDICT_S = 3.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
DIED = "the worker process died"
DEATH_LOOKUP_S = 5.0  # how long the dead ranks' logs are read for their causes
_PID = re.compile(r"\bpid[:=] ?(\d+)")  # ActorDiedError: "pid: 4242"; OutOfMemoryError: "pid=4242"
_SIGNAL_REPORT = re.compile(r"\*\*\* (SIG[A-Z]+) received")  # Ray's fatal-signal handler, on stderr
# Ray's memory monitor: OutOfMemoryError for the call it cut short; for calls sent after, an
# ActorDiedError of exit type NODE_OUT_OF_MEMORY ("... killed due to the node running low on memory").
_OOM_MARKERS = ("NODE_OUT_OF_MEMORY", "running low on memory")


def rank_failure(rank: int, node_rank: int | None, error: BaseException) -> RankFailure:
    """What ``ray.get`` raising ``error`` for ``rank`` says: a one-line reason, the remote
    traceback, and whether the worker is gone (its process died or became unreachable)."""
    text = _ANSI.sub("", str(error))
    if isinstance(error, RayTaskError):
        cause = error.cause if getattr(error, "cause", None) is not None else error
        reason = _ANSI.sub("", f"{type(cause).__name__}: {cause}").splitlines()[0]
        return RankFailure(rank, node_rank, reason, text)
    if isinstance(error, ActorUnavailableError):
        return RankFailure(rank, node_rank, "the worker became unreachable", text, gone=True)
    if isinstance(error, RayActorError) and "creation task" in text:
        last = next((line for line in reversed(text.splitlines()) if line.strip()), "")
        return RankFailure(rank, node_rank, f"the worker's constructor raised {last.strip()}", text)
    if isinstance(error, (RayActorError, OutOfMemoryError)):  # named by GroupCall._name_deaths
        pid = _PID.search(text)
        return RankFailure(rank, node_rank, DIED, gone=True, pid=int(pid[1]) if pid else None, detail=text)
    return RankFailure(rank, node_rank, f"{type(error).__name__}: {text}".splitlines()[0])


def last_words(pid: int) -> str:
    """The end of process ``pid``'s stderr log (``worker-*-<pid>.err``) on this node: run as a
    task there. Ray's fatal-signal handler and ``os._exit`` (``hosting.EXIT_NOTE``) write there."""
    for path in glob.glob(os.path.join(session_logs_dir(), f"worker-*-{pid}.err")):
        with open(path, "rb") as log:
            log.seek(max(0, os.path.getsize(path) - 16384))
            return log.read().decode(errors="replace")
    return ""


def death_cause(ray_text: str, log_tail: str) -> tuple[str, str]:
    """Why a worker process died, and its crash report, from what Ray said and the end of its
    stderr log. Ray knows only that the worker's connection closed ("Worker exit type:
    SYSTEM_ERROR ... End of file") unless its memory monitor killed it: raylets ignore SIGCHLD,
    so no exit status is kept anywhere."""
    if any(marker in ray_text for marker in _OOM_MARKERS):
        return "killed by Ray's memory monitor (OOM)", ""
    if report := _SIGNAL_REPORT.search(log_tail):
        return f"killed by signal {signal.Signals[report[1]].value} ({report[1]})", log_tail[report.start() :]
    if codes := re.findall(re.escape(EXIT_NOTE) + r"(-?\d+)", log_tail):
        return f"exited with code {codes[-1]}", ""
    return "presumably killed by signal 9 (SIGKILL): no exit code, no crash report", ""


@dataclass(eq=False, repr=False)
class GroupCall:
    """A pending fan-out over some ranks of a group; ``wait`` gathers it. ``gather`` combines the
    results (a split call); ``label`` names the group in errors (a fused role: ``policy/actor``)."""

    group: WorkerGroup
    action: str
    refs: list[ray.ObjectRef]
    ranks: list[int]
    default_timeout: float
    gather: Callable[[list[Any]], Any] | None = None
    label: str | None = None
    issued: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.group_name = self.label or self.group.name
        self._rank_of = dict(zip(self.refs, self.ranks, strict=True))
        self._unreachable: set[int] = set()

    def subset(self, ranks: Sequence[int]) -> GroupCall:
        """The same pending call, for ``ranks`` only (results in rank order, no gathering): e.g.
        to keep waiting for the ranks a ``WorkerGroupError`` reported as still running."""
        keep = set(ranks)
        refs = [ref for ref, rank in self._rank_of.items() if rank in keep]
        return replace(self, refs=refs, ranks=[self._rank_of[ref] for ref in refs], gather=None)

    def wait(self, timeout: float | None = None, stuck_after: float | Default | None = DEFAULT) -> Any:
        """Results in rank order (or gathered, for a split call). Raises ``WorkerGroupError`` at
        the first failed rank, or when ``timeout`` (default: the group's call timeout) passes.

        A rank that makes no progress — neither returns nor beats (``Worker.heartbeat()``) — for
        ``stuck_after`` seconds since the call was issued (default: the group's; None: never) is a
        failure of kind ``stuck``, reported with its Python stack (``rlinfra.runtime.watchdog``).

        After a first failure the other ranks get up to ``FAILURE_GRACE_S`` more to finish, so
        their results ride on the error; ranks blocked for good (in a collective with the dead
        one) are reported as still running instead of being waited for.
        """
        limit = self.default_timeout if timeout is None else timeout
        deadline = Deadline.after(limit)
        pending = list(self.refs)
        results: dict[int, Any] = {}
        failures: dict[int, RankFailure] = {}
        stuck_after = self.group.stuck_after if isinstance(stuck_after, Default) else stuck_after
        watch = None if stuck_after is None else StuckWatch(self.group, stuck_after, self.issued)
        while pending and not failures and not deadline.expired:
            slice_s = deadline.left() if watch is None else min(deadline.left(), watch.due_in())
            ready, pending = ray.wait(pending, num_returns=1, timeout=slice_s)
            self._collect(ready, results, failures)
            if watch is not None and not ready and watch.due_in() == 0:
                failures.update(self._stuck(watch, pending))
        if failures and pending:
            grace = deadline.sooner(FAILURE_GRACE_S).left()
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=grace)
            self._collect(ready, results, failures)
        elif pending:
            failures = self._no_answer(pending, limit)
            pending = []
        if failures:
            still_running = self._blame_lost_nodes(failures, [self._rank_of[ref] for ref in pending])
            self._name_deaths(failures)
            raise WorkerGroupError(self.group_name, self.action, failures, results, still_running)
        ordered = [results[rank] for rank in self.ranks]
        return self.gather(ordered) if self.gather else ordered

    def _stuck(self, watch: StuckWatch, pending: Sequence[ray.ObjectRef]) -> dict[int, RankFailure]:
        """Failures of kind ``stuck`` for the silent pending ranks, each with its stack (a rank
        that returned while it was being asked is not stuck: the next wait collects it)."""
        silent = watch.silent_ranks([self._rank_of[ref] for ref in pending])
        just_done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
        for ref in just_done:
            silent.pop(self._rank_of[ref], None)
        group, stuck = self.group, {}
        for rank, (quiet, age) in silent.items():
            reason = watch.reason(self.action, quiet, age)
            stuck[rank] = RankFailure(rank, group.node_rank_of(rank), reason, group.stack_of(rank), STUCK)
        return stuck

    def _no_answer(self, pending: Sequence[ray.ObjectRef], limit: float) -> dict[int, RankFailure]:
        reason = f"no answer within {limit:g} s (still running)"
        ranks = [self._rank_of[ref] for ref in pending]
        return {rank: RankFailure(rank, self.group.node_rank_of(rank), reason) for rank in ranks}

    def _collect(self, ready: list[Any], results: dict[int, Any], failures: dict[int, RankFailure]) -> None:
        for ref in ready:
            rank = self._rank_of[ref]
            try:
                results[rank] = ray.get(ref, timeout=0)
            except RayError as error:
                failures[rank] = rank_failure(rank, self.group.node_rank_of(rank), error)
                if isinstance(error, ActorUnavailableError):
                    self._unreachable.add(rank)

    def _settled_dead_nodes(self) -> set[int]:
        """Dead node ranks. A worker that became unreachable (connection reset) may be the first
        sign of a lost node, seen before Ray's health checks declare it: then wait, at most
        ``NODE_VERDICT_S``, for Ray's verdict on that node, so the error can say what happened."""
        dead = self.group.cluster.dead_node_ranks()
        suspects = {self.group.node_rank_of(rank) for rank in self._unreachable} - dead - {None}
        deadline = Deadline.after(NODE_VERDICT_S)
        while suspects and not deadline.expired:
            time.sleep(0.1)
            dead = self.group.cluster.dead_node_ranks()
            suspects -= dead
        return dead

    def _blame_lost_nodes(self, failures: dict[int, RankFailure], pending: list[int]) -> list[int]:
        """When a failed rank's node is gone, say so, and fail every pending rank on that node
        too (they can never answer); returns the ranks still pending after that."""
        dead = self._settled_dead_nodes()
        for rank in [*failures, *pending]:
            node = self.group.node_rank_of(rank)
            if node in dead:
                trace = failures[rank].traceback if rank in failures else ""
                reason = f"its node {node} was lost during {self.action}"
                failures[rank] = RankFailure(rank, node, reason, trace, gone=True)
        return [rank for rank in pending if self.group.node_rank_of(rank) not in dead]

    def _name_deaths(self, failures: dict[int, RankFailure]) -> None:
        """Name each dead process's pid, method and cause (``death_cause``), its log read on its
        node within ``DEATH_LOOKUP_S``; Ray's own text stays on the failure's ``detail``."""
        died = {rank: failure for rank, failure in failures.items() if failure.reason == DIED}
        if not died:
            return
        refs, nodes = {}, self.group.cluster.nodes
        for rank, failure in died.items():
            if failure.pid is not None and failure.node_rank is not None:
                refs[run_on_node(nodes[failure.node_rank].node_id, last_words, failure.pid)] = rank
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=DEATH_LOOKUP_S)  # late: ends soon
        words = {refs[ref]: ray.get(ref) for ref in ready if not _raised(ref)}
        for rank, failure in died.items():
            cause, report = death_cause(failure.detail, words.get(rank, ""))
            reason = f"{DIED} (pid {failure.pid}, in {self.action}): {cause}"
            failures[rank] = replace(failure, reason=reason, traceback=report)

    def __repr__(self) -> str:
        return f"GroupCall({self.group_name}.{self.action}, ranks={len(self.ranks)})"


def wait_all(calls: Sequence[GroupCall], timeout: float) -> list[Any]:
    """Each call's results (as its ``wait`` gives them), under one deadline for all of them.

    Raises ``WorkerGroupError`` at the first failure in any call: waiting call by call would hold
    one group's error back until another's timeout. At the deadline, the first call with ranks
    that never answered names them.
    """
    deadline = Deadline.after(timeout)
    owner = {ref: call for call in calls for ref in call.refs}
    pending = list(owner)
    while pending:
        if deadline.expired:
            late = next(call for call in calls if not set(call.refs).isdisjoint(pending))
            unanswered = [ref for ref in late.refs if ref in pending]
            raise WorkerGroupError(late.group_name, late.action, late._no_answer(unanswered, timeout))
        ready, pending = ray.wait(pending, num_returns=1, timeout=deadline.left())
        failed = next((owner[ref] for ref in ready if _raised(ref)), None)
        if failed is not None:
            failed.wait(timeout=FAILURE_GRACE_S)  # raises, naming the rank and its traceback
    return [call.wait(timeout=FAILURE_GRACE_S) for call in calls]


def _raised(ref: ray.ObjectRef) -> bool:
    try:
        ray.get(ref, timeout=0)
    except RayError:
        return True
    return False


def split_batch(batch: Any, parts: int) -> list[Any]:
    """Cut a list, tuple, numpy array or torch tensor into ``parts`` contiguous chunks whose
    sizes differ by at most one (the first chunks take the remainder)."""
    base, extra = divmod(len(batch), parts)
    sizes = [base + (index < extra) for index in range(parts)]
    bounds = itertools.pairwise(itertools.accumulate(sizes, initial=0))
    return [batch[start:end] for start, end in bounds]


def concat_chunks(chunks: list[Any]) -> Any:
    """Inverse of ``split_batch`` on the per-rank results: one sequence in rank order."""
    first = next((chunk for chunk in chunks if chunk is not None), None)
    module = type(first).__module__.split(".")[0]
    if module in ("numpy", "torch"):  # imported already: the chunks are its arrays
        return sys.modules[module].concatenate(chunks)
    return list(itertools.chain.from_iterable(chunks))
