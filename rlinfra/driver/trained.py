"""The trained groups' lifecycle: each launched with its rendezvous and restored from its own
payload of the checkpoint, every group checkpointed together with the driver's state, and, when a
rank of any is lost, each restarted from the last checkpoint (``_new_trainer``; ``Run`` rewinds
the run to it).

A mixin of ``Run`` (as ``WeightVersions`` is), for what it needs of the run: launching into the
layout (``launch``) and the time-sharing turns (``turns``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from rlinfra.driver.checkpoints import CheckpointError, CheckpointStore
from rlinfra.driver.supervisor import UnsupervisedLoss
from rlinfra.placement import ComponentPlacement
from rlinfra.runtime.group import WorkerGroup
from rlinfra.runtime.rendezvous import bring_up
from rlinfra.runtime.supervision import REFUSED, RESTARTED, Restart, RestartBudget, RestartBudgetExhausted
from rlinfra.runtime.timesharing import TimeSharing

from .trainer import check_trainer
from .versions import WeightVersions

if TYPE_CHECKING:
    from .job import Job
    from .run import Run

StartTrainer = Callable[[bytes | None, int | None], int]
"""``start(checkpoint, publish_above)``: the trainer group (``run.trainer``) launched and restored
from ``checkpoint`` (None: from scratch); returns the version its weights are published as, above
``publish_above`` when given."""


class TrainedGroups(WeightVersions):
    """``trainers``: every trained group by component, the publisher (``run.trainer``) among
    them; ``_last_checkpoint``: each one's payload and the driver's state a restart goes back to
    (none: the start)."""

    job: Job
    store: CheckpointStore
    placement: ComponentPlacement
    turns: TimeSharing | None = None
    _groups: list[WorkerGroup]
    trainers: dict[str, WorkerGroup]
    _restart_with: dict[str, tuple[StartTrainer, RestartBudget]]
    _last_checkpoint: tuple[dict[str, bytes], dict[str, Any] | None]
    launch: Callable[..., WorkerGroup]

    def start_trainer(
        self, make: Callable[[], WorkerGroup], component: str | None = None, *, backend: str = "gloo"
    ) -> WorkerGroup:
        """Launch the trained group ``make()`` as ``component`` (default: ``run.trainer``, the
        group whose weights the receivers serve; ``actor`` unless the config says otherwise), bring
        up its process group and call its ``setup(checkpoint)`` (restored from its own payload of
        the resumed checkpoint, if any); the same again, into the same bundles, when it is
        restarted (``make`` is called again). Returns the running group. A job may train more than
        one group (an actor and a critic): each is checkpointed with every checkpoint, and a lost
        rank of any restarts them all, each from its own payload.

        The version rule is rlinfra's, not the trainer's: a trainer counts its own versions (and
        checkpoints its count); the run publishes each as that count plus ``state.version_offset``,
        which a restart raises so that the restored weights go out above the version being served
        (versions only rise)."""
        name = component or self.settings.trainer
        if name in self.trainers:
            return self.trainers[name]
        self._refuse_unless_saved(name, "trained group")
        payloads = self._last_checkpoint[0]
        publisher = name == self.settings.trainer

        def start(checkpoint: bytes | None, publish_above: int | None) -> int:
            if name in self.trainers:
                self._groups.remove(self.trainers.pop(name))
            group = make()
            check_trainer(group.worker_cls, name, publishes=publisher)
            self.trainers[name] = launched = self.launch(name, group)
            if publisher:
                self.trainer = launched
            bring_up(launched, backend=backend)
            restored = int(launched.setup(checkpoint).wait()[0])
            if self.turns is not None:  # a restarted trainer takes its predecessor's turns, asleep
                self.turns.rejoin(launched)
            return self.state.published(restored, publish_above) if publisher else restored

        self._restart_with[name] = (start, RestartBudget(self.placement.get_strategy(name).restart))
        version = start(payloads.get(name), None)
        if publisher:
            self._first_version = version
            self._connect_weights()
        return self.trainers[name]

    def _refuse_unless_saved(self, name: str, what: str) -> None:
        """A ``CheckpointError`` when the checkpoint resumed from holds no payload of trained group
        ``name`` (``what`` says what names it, for the message)."""
        payloads, saved = self._last_checkpoint
        if saved is not None and name not in payloads:
            held = f"--resume: the checkpoint in {self.store.root} holds the state of"
            raise CheckpointError(f"{held} {', '.join(map(repr, payloads))}, not of {what} {name!r}")

    def checkpoint(self) -> None:
        """Save every trained group's state and the driver's (atomically); a restart goes back to it."""
        run = cast("Run", self)
        payloads = {name: self.job.trainer_state(run, group) for name, group in self.trainers.items()}
        saved = self.state.checkpointed()
        self._last_checkpoint = (payloads, saved)
        self.store.save(self.state.iteration, payloads, saved)

    def _new_trainer(
        self, name: str, loss: UnsupervisedLoss, checkpoint: bytes | None, restored_from: str
    ) -> Restart:
        """A data-parallel rank cannot be replaced in place (its peers sit in a collective with
        it), so the whole trained group ``name`` is, charged to its ``restart`` budget when it
        lost ranks: stopped, started again in the same bundles with a fresh rendezvous from
        ``checkpoint``; the publisher's weights go through the barrier as the version above the
        one served (versions only rise), so every receiver serves them before anything is made.
        ``restored_from`` says what ``checkpoint`` is, for the record. Every attempt is kept in
        ``state.trainer_restarts``, a refused one too (the budget spent:
        ``RestartBudgetExhausted``, the run stops); ``loss`` is raised again when there is no
        trainer to restart or no weights to publish."""
        sync, supervisor, lost = self.sync, self.supervisor, self.trainers[name]
        if name not in self._restart_with or sync is None or supervisor is None:
            raise loss
        start, budget = self._restart_with[name]
        restarts = self.state.trainer_restarts
        started, wall = time.monotonic(), time.time()
        ranks = loss.gone.get(name, [])
        rank = ranks[0] if ranks else 0
        node_rank = lost.node_rank_of(rank)
        cause = str(loss.cause).partition("\n")[0] or type(loss.cause).__name__
        try:
            if ranks:
                budget.charge(name, rank, node_rank)
        except RestartBudgetExhausted as spent:
            restarts.append(Restart(name, rank, node_rank, cause, wall, 0.0, REFUSED, str(spent)))
            raise
        lost.shutdown()
        version = start(checkpoint, sync.version)
        supervisor.watched = list(self.trainers.values())
        if name == self.settings.trainer:
            sync.replace_sender(self.trainer)
            self.supervised(lambda: sync.update(version))
        took_s = time.monotonic() - started
        reason = f"lost rank(s) {ranks}: {cause}" if ranks else f"with {', '.join(loss.gone)}: {cause}"
        restart = Restart(name, rank, node_rank, reason, wall, took_s, RESTARTED, restored_from)
        restarts.append(restart)
        return restart
