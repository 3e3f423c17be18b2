"""How ``Run`` rides out faults: the calls a driver makes into a supervised run, and the trainer's
restart from its checkpoint. Neither knows what the job trains.

``SupervisedSteps`` — the three ways a driver calls into a run that a ``Supervisor`` watches (a
mixin: ``Run`` is one):

    retried(step)      a step that can be redone (generate, score, stage, commit): when a worker
                       died during it, replace the dead and run the step again
    gathered(call, …)  every rank's result of a call that makes one batch per rank: a batch cut
                       short by a dead worker is reported lost and made again on its replacement
    on_trainer(call)   a trainer call, never redone (an update may have half happened): a lost
                       trainer rank becomes ``UnsupervisedLoss`` for the loop to restart the trainer
    heal(error)        replace the dead, keep the ``Recovery``, run the ``after_heal`` hook (the
                       driver's: e.g. a replaced engine put back to sleep in a time-shared layout)

``TrainerRestarter`` — a data-parallel rank cannot be replaced in place (its peers sit in a
collective with it), so the whole trainer group is:

    charge     the trainer's restart budget (``restart:`` in the YAML); spent → the run stops
    stop       every trainer rank
    start      a fresh group in the same bundles, a fresh rendezvous, the model from the checkpoint
    publish    the restored weights as the next version above the one served (versions only rise),
               through the normal barrier, so every receiver serves them before anything is made

What the driver rewinds (its state, its metrics, its batch ledger) is ``Run``'s to do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlinfra.driver.supervisor import Recovery, Supervisor, UnsupervisedLoss
from rlinfra.runtime.calls import GroupCall
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.group import WorkerGroup
from rlinfra.runtime.supervision import REFUSED, RESTARTED, Restart, RestartBudget, RestartBudgetExhausted
from rlinfra.services.weights import WeightSync, WeightSyncError

StartTrainer = Callable[[bytes | None, int | None], tuple[WorkerGroup, int]]
"""``start(checkpoint, publish_above)``: a trainer group restored from ``checkpoint`` (None: from
scratch) whose weight version is above ``publish_above``; returns the group and that version."""


class SupervisedSteps:
    """A driver's calls into a supervised run. The driver sets ``supervisor`` (None: nothing is
    supervised yet, and a failure stands) and ``recoveries``, which every recovery is appended to
    before ``after_heal()`` runs."""

    supervisor: Supervisor | None
    recoveries: list[Recovery]

    def after_heal(self) -> None:
        """What the driver does after every recovery (nothing, unless overridden)."""

    def heal(self, error: BaseException) -> Recovery:
        """Replace whoever died; re-raises ``error`` when nobody did, ``UnsupervisedLoss`` when a
        watched (trainer) rank is gone, ``SupervisionError`` when a rank cannot be replaced."""
        if self.supervisor is None:
            raise error
        recovery = self.supervisor.heal(error)
        self.recoveries.append(recovery)
        self.after_heal()
        return recovery

    def retried(self, step: Callable[[], Any]) -> Any:
        """``step()``, again after replacing whoever died during it (restart budgets bound the
        retries: a spent one raises instead)."""
        while True:
            try:
                return step()
            except (WorkerGroupError, WeightSyncError) as error:
                self.heal(error)

    def gathered(
        self,
        pending: GroupCall,
        lost: Callable[[list[int]], None],
        remake: Callable[[list[int]], GroupCall],
    ) -> dict[int, Any]:
        """Every rank's result of ``pending`` (rank → result), for a call where each rank makes
        its own batch. The ranks whose call failed are handed to ``lost`` (what they were making
        is never used), the dead are replaced, and ``remake(ranks)`` issues their work again; the
        results that finished are kept and the calls still running are waited for. A call issued
        before a recovery finished may fail on a worker that recovery already replaced or
        dropped: it is made again too, with nobody left to replace."""
        done: dict[int, Any] = {}
        calls = [pending]
        while calls:
            call = calls.pop()
            try:
                done.update(zip(call.ranks, call.wait(), strict=True))
            except WorkerGroupError as error:
                done.update(error.results)
                lost(error.failed_ranks)
                if not self.recoveries or self.recoveries[-1].finished_monotonic <= call.issued:
                    self.heal(error)  # unless a recovery finished after this call was issued
                if error.pending:
                    calls.append(call.subset(error.pending))
                calls.append(remake(error.failed_ranks))
        return done

    def on_trainer(self, call: Callable[[], Any]) -> Any:
        """``call()`` on the trainer, never retried: a lost trainer rank raises
        ``UnsupervisedLoss``; a dead replaceable worker is replaced and the error re-raised."""
        try:
            return call()
        except WorkerGroupError as error:
            self.heal(error)  # raises UnsupervisedLoss for the trainer, or the error itself
            raise


@dataclass
class TrainerRestarter:
    """Restarts a trainer group whole, from a checkpoint; see the module docstring. Every attempt,
    refused ones included, is appended to ``restarts``."""

    budget: RestartBudget
    start: StartTrainer
    sync: WeightSync
    steps: SupervisedSteps
    restarts: list[Restart]

    def restart(
        self, trainer: WorkerGroup, loss: UnsupervisedLoss, checkpoint: bytes | None, restored_from: str
    ) -> tuple[WorkerGroup, Restart]:
        """The new trainer group (already serving its weights to every receiver) and the record
        of the restart. ``restored_from`` says what ``checkpoint`` is, for the record. Raises
        ``RestartBudgetExhausted`` (recorded as refused) when the budget is spent."""
        started, wall = time.monotonic(), time.time()
        lost_ranks = loss.gone.get(trainer.name, [])
        rank = lost_ranks[0] if lost_ranks else 0
        node_rank = trainer.node_rank_of(rank)
        cause = str(loss.cause).partition("\n")[0] or type(loss.cause).__name__
        try:
            self.budget.charge(trainer.name, rank, node_rank)
        except RestartBudgetExhausted as spent:
            refused = Restart(trainer.name, rank, node_rank, cause, wall, 0.0, REFUSED, str(spent))
            self.restarts.append(refused)
            raise
        trainer.shutdown()
        group, version = self.start(checkpoint, self.sync.version)
        self.sync.replace_sender(group)
        supervisor = self.steps.supervisor
        assert supervisor is not None  # it watches the trainer that was lost
        supervisor.watched = [group if watched is trainer else watched for watched in supervisor.watched]
        self.steps.retried(lambda: self.sync.update(version))
        reason = f"lost rank(s) {lost_ranks}: {cause}"
        restart = Restart(
            trainer.name, rank, node_rank, reason, wall, time.monotonic() - started, RESTARTED, restored_from
        )
        self.restarts.append(restart)
        return group, restart
