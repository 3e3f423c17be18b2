"""``Supervisor``: after a failed call, replace the dead workers of a run's replaceable groups.

Rollout and env workers hold nothing between iterations that cannot be rebuilt: weights (the
rollout workers', re-admitted at the committed version) and env state (reset). So when a call
fails because some of them died, the run need not stop; ``heal`` does, in order:

    find        which ranks of which groups are gone (``WorkerGroup.gone_ranks``)
    abandon     the version staged on the rollout workers, if any (the newcomer lacks it)
    replace     each gone rank into its own bundle, charged to its group's restart budget
    admit       replaced rollout workers at the committed version (``WeightSync.admit``)
    rewire      the caller's hook: e.g. env workers learn their rollout workers' new handles
    re-stage    the abandoned version, now on every rollout worker

``resize`` is the same sequence without a death: elastic rollout (workers removed, or added back
into their reserved bundles, admitted at the committed version).

A rank whose node is gone cannot be replaced; in a group named ``shrinkable`` (rollout workers,
when the algorithm can use fewer) it is removed and the run goes on with the others.

``heal`` returns the ``Recovery`` (its ``Restart`` records); it re-raises the original error
when nobody died (a worker that raised is a bug, not a fault to ride out), and raises the
``SupervisionError`` of a rank that cannot be replaced (restart budget spent, node gone).
Groups it does not supervise (a data-parallel trainer) are reported as ``UnsupervisedLoss`` for
the caller to handle, e.g. by restarting the trainer from its checkpoint.
"""

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.group import WorkerGroup
from rlinfra.runtime.supervision import Restart, UnreplaceableError
from rlinfra.services.weights import WeightSync, WeightSyncError


class UnsupervisedLoss(RuntimeError):
    """Ranks of a group the supervisor does not replace are gone; ``gone`` maps group → ranks."""

    def __init__(self, gone: Mapping[str, list[int]], cause: BaseException) -> None:
        self.gone, self.cause = dict(gone), cause
        named = "; ".join(f"{group} rank(s) {ranks}" for group, ranks in self.gone.items())
        super().__init__(f"lost {named}, which are not replaced in place\n{cause}")


@dataclass
class Recovery:
    """One ``heal``: what failed, which ranks were replaced, and how long until they served."""

    cause: str
    restarts: list[Restart] = field(default_factory=list)
    dropped: list[tuple[str, int]] = field(default_factory=list)  # unreplaceable, gone on without
    admitted_version: int | None = None
    took_s: float = 0.0
    finished_at: float = 0.0  # Unix time the replacements were admitted and rewired
    finished_monotonic: float = 0.0  # the same moment on the monotonic clock (GroupCall.issued's)


@dataclass
class Supervisor:
    """Replaces the dead workers of ``groups``; ``receivers`` (one of them) are re-admitted
    through ``sync``; ``rewire(replaced)`` runs once they are all back (group name → ranks)."""

    groups: Sequence[WorkerGroup]
    sync: WeightSync | None = None
    rewire: Callable[[dict[str, list[int]]], None] | None = None
    watched: Sequence[WorkerGroup] = ()  # checked for deaths, but not replaced here
    shrinkable: Sequence[WorkerGroup] = ()  # may go on with fewer ranks when one is unreplaceable

    def heal(self, cause: BaseException) -> Recovery:
        """Replace every gone rank after ``cause``; see the module docstring. A newcomer that dies
        while it is being brought in (a second fault) is replaced in turn, each time charged to
        its group's budget, so this ends: healed, or a ``SupervisionError``."""
        started = time.monotonic()
        gone = self._gone(cause)
        if not gone:
            raise cause
        recovery, fault = Recovery(str(cause).partition("\n")[0] or type(cause).__name__), cause
        with self._restaged(abandon=True) as changed:
            while gone:
                for name, ranks in gone.items():
                    changed.setdefault(name, set()).update(ranks)
                try:
                    self._bring_back(gone, recovery, fault)
                    gone = self._gone(cause)
                except (WorkerGroupError, WeightSyncError) as second:
                    gone, fault = self._gone(second), second  # who died meanwhile; nobody: it stands
                    if not gone:
                        raise
        recovery.took_s = time.monotonic() - started
        recovery.finished_at, recovery.finished_monotonic = time.time(), time.monotonic()
        return recovery

    def _gone(self, cause: BaseException) -> dict[str, list[int]]:
        """Gone ranks of the supervised groups by name; ``UnsupervisedLoss`` for watched ones."""
        lost = {group.name: ranks for group in self.watched if (ranks := group.gone_ranks())}
        if lost:
            raise UnsupervisedLoss(lost, cause) from cause
        return {group.name: ranks for group in self.groups if (ranks := group.gone_ranks())}

    def _bring_back(self, gone: dict[str, list[int]], recovery: Recovery, fault: BaseException) -> None:
        """Replace (or, in a shrinkable group, drop when unreplaceable) the gone ranks, each for
        the reason ``fault`` gives it (how its process died), and admit replaced weight receivers
        at the committed version."""
        said = fault.cause if isinstance(fault, WeightSyncError) else fault
        error = said if isinstance(said, WorkerGroupError) else None
        reasons = {(error.group, rank): f.reason for rank, f in error.failures.items()} if error else {}
        for group in self.groups:
            for rank in gone.get(group.name, []):
                try:
                    reason = reasons.get((group.name, rank), recovery.cause)
                    recovery.restarts.append(group.replace(rank, reason=reason))
                except UnreplaceableError:
                    if group not in self.shrinkable or len(group.ranks) <= 1:
                        raise
                    group.remove([rank])  # its node is gone: go on with the others
                    recovery.dropped.append((group.name, rank))
        sync = self.sync
        if sync is not None and sync.receivers.name in gone:
            dropped = [rank for name, rank in recovery.dropped if name == sync.receivers.name]
            sync.leave(dropped)
            replaced = [rank for rank in gone[sync.receivers.name] if rank not in dropped]
            if replaced:
                recovery.admitted_version = sync.admit(replaced)

    def resize(self, group: WorkerGroup, *, add: Sequence[int] = (), remove: Sequence[int] = ()) -> None:
        """Elastic rollout, between iterations (nothing in flight on ``group``): stop ``remove``,
        start ``add`` again in their reserved bundles, admitted at the committed version when
        ``group`` is the weight receivers — the replacement mechanism without a death — then
        rewire and re-stage as ``heal`` does."""
        sync = self.sync if self.sync is not None and group is self.sync.receivers else None
        with self._restaged(abandon=sync is not None) as changed:
            changed[group.name] = {*add, *remove}
            if remove:
                group.remove(remove)
                if sync is not None:
                    sync.leave(remove)
            if add:
                group.add(add)
                if sync is not None:
                    sync.admit(add)

    @contextlib.contextmanager
    def _restaged(self, abandon: bool) -> Iterator[dict[str, set[int]]]:
        """Around a change of ranks (group name → the ranks the block changed): the staged version
        abandoned first when ``abandon`` (a newcomer lacks it), then ``rewire`` told the ranks and
        the abandoned version staged again on everyone."""
        sync = self.sync
        changed: dict[str, set[int]] = {}
        abandoned = sync.abandon() if sync is not None and abandon else None
        yield changed
        if self.rewire is not None:
            self.rewire({name: sorted(ranks) for name, ranks in changed.items()})
        if sync is not None and abandoned is not None:
            sync.prepare(abandoned)
