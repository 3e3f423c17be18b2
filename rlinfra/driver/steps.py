"""The pieces of the loop a job writes in ``Job.loop``, each keeping its own bookkeeping:

    stream = run.batches(group, Worker.method, args)   a ``BatchStream``: one batch per rank per call
    for step in run.steps(total):                       a ``Step`` per iteration (``Run.steps``)
        batches = stream.gather()                       the batches in flight (issued now if none are)
        run.commit()                                    the version staged last step, between batches
        stream.issue()                                  the next batches, on the newest weights
        update = step.train(trainer.method, batches)    the trainer's ``Update``; its version staged
        step.log(key=value)                             the job's metrics, added to the step's record

A batch is named (its id issued) before it is made, and every id ends once (``BatchLedger``):
trained when the trainer reports it, dropped when too stale, lost when its maker died.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rlinfra.runtime.group import WorkerGroup

from .records import Batch, ContractError, Update, expect
from .supervised import Pending, SupervisedSteps

if TYPE_CHECKING:
    from .run import Run


@dataclasses.dataclass(eq=False)
class BatchStream:
    """Batches made by every rank of ``group`` with ``method(batch_id, *args(rank))``, one call at
    a time; each returns a ``Batch`` stamped with its id and the weight version that made it.
    ``args`` is evaluated once per call, when it is issued: a batch made again (its maker died)
    is made from the same arguments. ``pending``: the call in flight, once issued."""

    steps: SupervisedSteps
    group: WorkerGroup
    method: Callable[..., Any]
    args: Callable[[int], tuple[Any, ...]]
    pending: Pending | None = None

    @property
    def name(self) -> str:
        """``group: method``, for errors."""
        return f"{self.group.name}: {getattr(self.method, '__name__', self.method)}"

    def issue(self) -> None:
        """Start the next batches; a second issue before ``gather`` is refused."""
        if self.pending is not None and self.pending in self.steps.in_flight:
            raise ContractError(f"{self.name} is already in flight; gather() its batches first")
        args = {rank: self.args(rank) for rank in self.group.ranks}
        self.pending = self.steps.generate(
            self.group, self.method, lambda rank, batch_id: (batch_id, *args[rank])
        )

    def gather(self) -> list[Batch]:
        """The batches in flight (issued now if none are: the first step, or after a restart
        dropped them), in rank order; one cut short by a dead worker is made again."""
        if self.pending is None or self.pending not in self.steps.in_flight:
            self.issue()
        assert self.pending is not None
        batches = []
        for made in self.steps.gather(self.pending):
            batch = expect(Batch, made.value, self.name)
            if batch.id != made.id:
                expected = f"expected the id it was given, {made.id!r}"
                raise ContractError(f"{self.name} returned a Batch with id {batch.id!r}; {expected}")
            batches.append(dataclasses.replace(batch, rank=made.rank))
        self.pending = None
        return batches


class Step:
    """One iteration of ``run.steps``: ``number`` (1-based, across resumes) and whether it is the
    ``last`` of the budget. Its record (what ``step.log`` adds, what ``drop_stale`` counted) is
    written when the loop comes back for the next step."""

    def __init__(self, run: Run, number: int, last: bool) -> None:
        self.run, self.number, self.last = run, number, last
        self.record: dict[str, Any] = {}
        self.updates: dict[str, Update | None] = {}  # each trained group's, once it has updated
        self.trained = False

    def drop_stale(self, batches: Sequence[Batch], max_staleness: int) -> list[Batch]:
        """The batches at most ``max_staleness`` versions behind the trainer; the others are
        dropped (never trained on) and counted in the record."""
        state, learner = self.run.state, self.run.learner_version
        state.batch_versions.append([b.version for b in batches])
        stale = [b.id for b in batches if learner - b.version > max_staleness]
        state.ledger.dropped(stale)
        state.dropped_batches += len(stale)
        oldest = min((b.version for b in batches), default=learner)
        self.record |= {"batch_version": oldest, "staleness": learner - oldest, "dropped": len(stale)}
        return [b for b in batches if learner - b.version <= max_staleness]

    def train(self, method: Callable[..., Any], batches: Sequence[Batch], *args: Any) -> Update | None:
        """``method(batches, *args)`` on every rank of a trained group (rank 0's ``Update`` is
        kept), never redone: an update may have half happened. The publisher's version is staged
        on the weight receivers at once (prepared while they generate). Once every trained group
        has updated, their batch ids end as trained and the step is done, checkpointed every
        ``run.checkpoint_every``. Batches the trainer could not read (``Update.lost``: their
        maker died) end as lost and the update is made on the others. With no batches nothing is
        called and None returned: the step still counts. Another group's metrics are logged
        under its name (``critic_loss``)."""
        run, group = self.run, getattr(method, "group", None)
        name = run.settings.trainer if group is None else group.name
        if group is not None and name not in run.trainers:
            raise ContractError(f"step.train: {name} is not a trained group; start it with run.start_trainer")
        if name in self.updates:
            raise ContractError(f"step {self.number}: {name} was trained twice; a step makes one update each")
        kept, update = list(batches), None
        while kept and update is None:
            made = run.call_trainer(lambda kept=kept: method(kept, *args).wait()[0])  # type: ignore[misc]
            update = expect(Update, made, str(method))
            if update.lost:
                lost = [b for b in kept if b.id in set(update.lost)]
                if not lost:  # else the same call again, forever
                    raise ContractError(f"{method} reported as lost batches it was not given: {update.lost}")
                run.lost(lost)
                kept, update = [b for b in kept if b not in lost], None
        self.updates[name] = update
        if update is not None and name == run.settings.trainer:
            run.stage(update.version)
        if update is not None:
            prefix = "" if name == run.settings.trainer else f"{name}_"  # another group's, under its name
            self.log(**{prefix + key: value for key, value in update.metrics.items()})
        if not self.waiting_for():
            self.trained = True
            done = (batch_id for u in self.updates.values() if u is not None for batch_id in u.batch_ids)
            run.record_update(dict.fromkeys(done))
        return update

    def waiting_for(self) -> list[str]:
        """The trained groups that have not updated in this step yet."""
        return [name for name in self.run.trainers if name not in self.updates]

    def log(self, **metrics: Any) -> None:
        """Add the job's ``metrics`` to this step's record (floats rounded to 5 places)."""
        self.record |= {key: round(v, 5) if isinstance(v, float) else v for key, v in metrics.items()}
