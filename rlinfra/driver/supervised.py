"""How ``Run`` rides out faults: the calls a driver makes into a supervised run. They do not know
what the job trains.

``SupervisedSteps`` — the ways a driver calls into a run that a ``Supervisor`` watches (a mixin:
``Run`` is one):

    supervised(step)   a step that can be redone (score, stage, commit): when a worker died during
                       it, replace the dead and run the step again
    generate / gather  one batch per rank, each under a batch id of the ledger: a batch cut short
                       by a dead worker is lost (never used) and made again on its replacement
    lost(batches)      batches whose maker died after making them: lost, the dead replaced
    call_trainer(call) a trainer call, never redone (an update may have half happened): a lost
                       trainer rank becomes ``UnsupervisedLoss`` for the loop to restart the trainer
    heal(error)        replace the dead, keep the ``Recovery``, run the ``after_heal`` hook (the
                       driver's: e.g. a replaced engine put back to sleep in a time-shared layout)

The trainer's restart from its checkpoint (a lost trainer rank: ``UnsupervisedLoss``) is
``Run``'s: it rewinds the driver with it.
"""

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rlinfra.driver.supervisor import Recovery, Supervisor
from rlinfra.runtime.calls import GroupCall
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.group import WorkerGroup
from rlinfra.services.weights import WeightSyncError

from .state import RunState


@dataclass(frozen=True)
class Gathered:
    """What one rank returned for a ``generate`` call, under the batch id it was made for."""

    rank: int
    id: str
    value: Any


@dataclass(eq=False)
class Pending:
    """Batches being made: one call, one batch id per rank; ``args(rank, batch_id)`` are a rank's."""

    group: WorkerGroup
    method: Callable[..., Any]
    args: Callable[[int, str], tuple[Any, ...]]
    ids: dict[int, str]
    call: GroupCall


class SupervisedSteps:
    """A driver's calls into a supervised run. The driver sets ``supervisor`` (None: nothing is
    supervised yet, and a failure stands), ``state`` (its ledger issues the batch ids; every
    recovery is appended to its ``recoveries`` before ``after_heal()`` runs) and ``in_flight``
    (the batches being made)."""

    supervisor: Supervisor | None = None
    state: RunState
    in_flight: list[Pending]

    def after_heal(self) -> None:
        """What the driver does after every recovery (nothing, unless overridden)."""

    def heal(self, error: BaseException) -> Recovery:
        """Replace whoever died; re-raises ``error`` when nobody did, ``UnsupervisedLoss`` when a
        watched (trainer) rank is gone, ``SupervisionError`` when a rank cannot be replaced."""
        if self.supervisor is None:
            raise error
        recovery = self.supervisor.heal(error)
        self.state.recoveries.append(recovery)
        self.after_heal()
        return recovery

    def supervised(self, step: Callable[[], Any]) -> Any:
        """``step()``, again after replacing whoever died during it (restart budgets bound the
        retries: a spent one raises instead)."""
        while True:
            try:
                return step()
            except (WorkerGroupError, WeightSyncError) as error:
                self.heal(error)

    def generate(
        self, group: WorkerGroup, method: Callable[..., Any], args: Callable[[int, str], tuple[Any, ...]]
    ) -> Pending:
        """Every rank of ``group`` calls ``method(*args(rank, batch_id))`` to make one batch, under a
        batch id issued now; ``gather`` collects them."""
        pending = self._issue(group, method, args, list(group.ranks))
        self.in_flight.append(pending)
        return pending

    def _issue(self, group: WorkerGroup, method: Any, args: Any, ranks: list[int]) -> Pending:
        ids = {rank: self.state.ledger.issue(f"{group.name}:{rank}") for rank in ranks}
        call = group.call(method, ranks, per_rank=[args(rank, ids[rank]) for rank in ranks])
        return Pending(group, method, args, ids, call)

    def gather(self, pending: Pending) -> list[Gathered]:
        """Every rank's batch, in rank order. One cut short by a dead worker is never used: its id
        is lost, the dead are replaced, and the batch is made again under a new id; the batches
        that finished are kept and the calls still running are waited for. A call issued before a
        recovery finished may fail on a worker that recovery already replaced (or on a peer it
        replaced or dropped: an env worker's rollout worker): it is made again too, with nobody
        left to replace. A rank the recovery dropped makes nothing more."""
        done: dict[int, Any] = {}
        calls = [pending.call]
        while calls:
            call = calls.pop()
            try:
                done.update(zip(call.ranks, call.wait(), strict=True))
            except WorkerGroupError as error:
                done.update(error.results)
                self.state.ledger.lost(pending.ids[rank] for rank in error.failed_ranks)
                recoveries = self.state.recoveries
                if not recoveries or recoveries[-1].finished_monotonic <= call.issued:
                    self.heal(error)  # unless a recovery finished after this call was issued
                if error.pending:
                    calls.append(call.subset(error.pending))
                running = [rank for rank in error.failed_ranks if rank in pending.group.ranks]
                if running:  # a rank the recovery dropped (its node is gone) makes nothing more
                    again = self._issue(pending.group, pending.method, pending.args, running)
                    pending.ids.update(again.ids)
                    calls.append(again.call)
        self.in_flight.remove(pending)
        return [Gathered(rank, pending.ids[rank], done[rank]) for rank in sorted(done)]

    def lost(self, batches: Iterable[Any]) -> None:
        """Batches whose maker died after making them (the trainer could not use them): their ids
        end as lost, and whoever is gone now is replaced."""
        self.state.ledger.lost(b.id for b in batches)
        with contextlib.suppress(_NobodyGone):
            self.heal(_NobodyGone("a worker died"))

    def call_trainer(self, call: Callable[[], Any]) -> Any:
        """``call()`` on the trainer, never retried: a lost trainer rank raises
        ``UnsupervisedLoss``; a dead replaceable worker is replaced and the error re-raised."""
        try:
            return call()
        except WorkerGroupError as error:
            self.heal(error)  # raises UnsupervisedLoss for the trainer, or the error itself
            raise


class _NobodyGone(RuntimeError):
    """What ``lost`` hands ``Supervisor.heal``, which re-raises it when nobody died."""
