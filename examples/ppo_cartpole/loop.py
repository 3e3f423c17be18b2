"""The driver loop: PPO as the driver runs it, top to bottom. One iteration, with
``algo.max_staleness: 1`` (the default):

    wait for rollout k            made entirely with weight version v (checked, stamped)
    commit v+1 if staged          pause → swap → verify → resume, between rollouts: nothing in flight
    start rollout k+1             on the newest weights; runs while the actor trains on rollout k
    train on rollout k            2 data-parallel ranks; version v+1 → v+2
    prepare v+2                   staged into the rollout workers while rollout k+1 goes on

So generation overlaps training and weight staging, each batch has exactly one version, and a
batch is at most one update old when trained on (older ones would be dropped by ``filter_stale``).
With ``max_staleness: 0`` the loop is strictly on-policy: collect, train, update, repeat.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from examples.ppo_cartpole import reporting
from examples.ppo_cartpole.config import JobConfig
from examples.ppo_cartpole.console import iteration_display
from examples.ppo_cartpole.env_worker import EnvWorker
from examples.ppo_cartpole.launch import Components
from examples.ppo_cartpole.state import DriverState
from rlinfra.runtime.calls import GroupCall
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.services.recovery import SupervisedSteps, TrainerRestarter
from rlinfra.services.signals import CtrlC
from rlinfra.services.supervisor import Supervisor, UnsupervisedLoss
from rlinfra.services.weights import Stamped, WeightSync, filter_stale


def train(
    live: Components,
    sync: WeightSync,
    job: JobConfig,
    state: DriverState,
    log: reporting.MetricsLog,
    console: Console,
    on_iteration: Callable[[dict[str, Any]], None] | None,
    between_rollouts: Callable[[RolloutScaling], None] | None = None,
    resumed_from: tuple[bytes, dict[str, Any]] | None = None,
) -> bool:
    """Iterate (the loop logs and checkpoints each iteration) and show progress. True once the
    target return is reached; False when the iteration budget ran out first. ``resumed_from``:
    the checkpoint a resumed run started from (a trainer restart before the next one uses it)."""
    ctrl_c = CtrlC()
    loop = TrainingLoop(live, sync, job, state, log, between_rollouts)
    loop.checkpoint = resumed_from
    with ctrl_c.watching(), iteration_display(console, job.algo.iterations, state.iteration) as show:
        for record in loop.iterations():
            show(record)
            if on_iteration is not None:
                on_iteration(record)
            if ctrl_c.pressed:  # its KeyboardInterrupt was swallowed somewhere: stop here
                raise KeyboardInterrupt
            if record["mean_return"] >= job.algo.target_return:
                return True
    return False


def replicas_in_sync(live: Components, iteration: int) -> bool:
    """Data parallelism must keep every actor rank's parameters bit-identical; rank 0 alone is
    checkpointed and published, so a divergence would go unseen. Stop rather than train on."""
    digests = live.actor.parameters_digest().wait()
    if len(set(digests)) != 1:
        raise RuntimeError(
            f"actor replicas diverged at iteration {iteration}: parameter digests "
            + ", ".join(f"rank {rank}: {digest[:12]}" for rank, digest in enumerate(digests))
        )
    return True


@dataclass
class RolloutScaling:
    """Handed to ``run(between_rollouts=...)`` once per iteration, when no rollout is in flight:
    remove rollout workers or add removed ones back (elastic rollout; added ones are admitted at
    the committed weight version before they serve)."""

    iteration: int
    live: Components

    @property
    def ranks(self) -> list[int]:
        return self.live.rollout.ranks

    @property
    def removed(self) -> list[int]:
        return self.live.rollout.removed_ranks

    def remove(self, ranks: list[int]) -> None:
        self._supervisor().resize(self.live.rollout, remove=ranks)

    def add(self, ranks: list[int]) -> None:
        self._supervisor().resize(self.live.rollout, add=ranks)

    def _supervisor(self) -> Supervisor:
        if self.live.supervisor is None:
            raise RuntimeError("the job is not launched")
        return self.live.supervisor


class NobodyGone(RuntimeError):
    """What ``Supervisor.heal`` re-raises when it finds nobody to replace."""


class TrainingLoop:
    """Rollouts in, one update per iteration, new weights out; each iteration is logged,
    checkpointed and yielded as its record.

    Dead rollout and env workers are replaced on the way (``live.supervisor``): a rollout cut
    short is recollected under a new batch id, a weight update that lost a worker is redone.
    A lost trainer rank is restarted with its whole group from the last checkpoint
    (``TrainerRestarter``), and the iterations since are redone. The batch ledger in ``state``
    proves that every batch was trained on once, dropped, lost or rolled back."""

    def __init__(
        self,
        live: Components,
        sync: WeightSync,
        job: JobConfig,
        state: DriverState,
        log: reporting.MetricsLog,
        between_rollouts: Callable[[RolloutScaling], None] | None = None,
    ) -> None:
        self.live, self.sync, self.algo, self.state, self.log = live, sync, job.algo, state, log
        self.between_rollouts = between_rollouts
        self.run = job.run
        self.overlap = self.algo.max_staleness >= 1
        self.staged_version: int | None = None  # trained and staged on the rollout workers, not yet served
        self.collecting: dict[int, str] = {}  # env rank -> id of the batch it is making
        self.pending: GroupCall | None = None  # the rollouts being made
        self.checkpoint: tuple[bytes, dict[str, Any]] | None = None  # the last one saved
        self.sync_s = {"prepare_s": 0.0, "pause_s": 0.0, "held_s": 0.0}
        assert live.supervisor and live.trainer_budget and live.start_trainer, "the job is not launched"
        self.steps = SupervisedSteps(live.supervisor, state.recoveries)
        self.restarter = TrainerRestarter(
            live.trainer_budget, live.start_trainer, sync, self.steps, state.trainer_restarts
        )
        state.served_versions.append(sync.version)

    def iterations(self) -> Iterator[dict[str, Any]]:
        """Run until the iteration budget (the caller stops at the target return)."""
        self.clock = time.perf_counter()
        self.pending = self._start_collect()
        while self.state.iteration < self.algo.iterations:
            try:
                record = self._iteration()
            except UnsupervisedLoss as loss:  # a trainer rank: the whole group, from the checkpoint
                self._restart_trainer(loss)
                continue
            yield record

    def _iteration(self) -> dict[str, Any]:
        state, algo = self.state, self.algo
        rollouts, collect_s = _timed(self._finish_collect, self.pending)
        self.pending = None
        if self.between_rollouts is not None:  # nothing in flight: rollout workers may come and go
            self.between_rollouts(RolloutScaling(state.iteration, self.live))
        self._commit_staged()  # between rollouts: nothing in flight, no batch can mix versions
        more = state.iteration + 1 < algo.iterations
        if self.overlap and more:
            self.pending = self._start_collect()  # on the newest weights, while the actor trains
        learned, train_s = _timed(self._learn, rollouts)
        if not self.overlap:
            self._commit_staged()
            if more:
                self.pending = self._start_collect()
        now = time.perf_counter()
        state.training_s += now - self.clock
        self.clock = now
        state.iteration += 1
        record = self._record(learned, collect_s, train_s)
        self._log_and_checkpoint(record)
        return record

    def _log_and_checkpoint(self, record: dict[str, Any]) -> None:
        """Every ``checkpoint_every`` iterations: the replicas checked, the trainer saved."""
        state = self.state
        checkpointing = state.iteration % self.run.checkpoint_every == 0
        if checkpointing:
            record["replicas_in_sync"] = self.steps.on_trainer(
                lambda: replicas_in_sync(self.live, state.iteration)
            )
        self.log.write(record)
        if checkpointing:
            actor_state = self.steps.on_trainer(lambda: self.live.actor.execute_on(0).checkpoint().wait()[0])
            self.checkpoint = (actor_state, state.checkpointed())
            reporting.save_checkpoint(Path(self.run.output_dir), *self.checkpoint)

    def _restart_trainer(self, loss: UnsupervisedLoss) -> None:
        """Bring the trainer back from the last checkpoint (or from scratch before the first),
        serving its weights above the last version; rewind the driver, its metrics and its
        ledger to that checkpoint (the iterations since are redone: none repeated in the record,
        none skipped); start collecting again. Rollout and env workers are not touched."""
        state = self.state
        if self.pending is not None:  # made with the lost trainer's weights: not trained on
            with contextlib.suppress(WorkerGroupError):
                self.pending.wait()
            self.pending = None
        actor_bytes, saved = self.checkpoint if self.checkpoint is not None else (None, None)
        back_to = int(saved["iteration"]) if saved is not None else 0
        detail = f"from the checkpoint of iteration {back_to}" if saved is not None else "from scratch"
        self.live.actor, _ = self.restarter.restart(self.live.actor, loss, actor_bytes, detail)
        state.served_versions.append(self.sync.version)
        state.ledger.dropped(state.ledger.open_ids)  # made with the lost trainer's weights
        state.ledger.rolled_back(after_iteration=back_to)
        state.rewind(saved)
        self.log.rewind(back_to)
        self.staged_version = None
        self.pending = self._start_collect()

    @property
    def learner_version(self) -> int:
        """The trainer's weight version: the one staged, if any, else the one served."""
        return self.staged_version if self.staged_version is not None else self.sync.version

    # ------------------------------------------------------------------------------ rollouts
    def _start_collect(self, ranks: list[int] | None = None) -> GroupCall:
        """Every env worker (or ``ranks``) makes one rollout, under a batch id issued now."""
        env = self.live.env
        chosen = env.ranks if ranks is None else ranks
        for rank in chosen:
            self.collecting[rank] = self.state.ledger.issue(f"env:{rank}")
        return env.call(EnvWorker.collect, chosen, per_rank=[(self.collecting[rank],) for rank in chosen])

    def _finish_collect(self, pending: GroupCall) -> list[dict[str, Any]]:
        """Every env worker's rollout, in rank order. A rollout cut short by a dead worker is
        never used: its id is lost, the dead are replaced, and it is made again under a new id
        (``SupervisedSteps.gathered``)."""
        done = self.steps.gathered(
            pending,
            lost=lambda ranks: self.state.ledger.lost(self.collecting[rank] for rank in ranks),
            remake=self._start_collect,
        )
        return [done[rank] for rank in sorted(done)]

    # ------------------------------------------------------------------------------- weights
    def _commit_staged(self) -> None:
        """Pause → swap → verify → resume for the version staged last iteration, if any (staged
        again first if a replacement dropped it)."""
        version = self.staged_version
        if version is None:
            return
        report = self.steps.retried(lambda: self.sync.commit_version(version))
        self.sync_s["pause_s"], self.sync_s["held_s"] = report.pause_s, report.held_s
        self.state.served_versions.append(self.sync.version)
        self.staged_version = None

    def _stage(self, version: int) -> None:
        """Stage ``version`` on every rollout worker while the env workers keep generating."""
        self.sync_s["prepare_s"] = self.steps.retried(lambda: self.sync.staged_or_prepare(version)).prepare_s
        self.staged_version = version

    def _train(self, rollouts: list[dict[str, Any]]) -> dict[str, Any] | None:
        """One update on ``rollouts``; the metrics, or None when every one of them was lost. A
        rollout whose env worker died after making it is gone with it: counted lost, the worker
        replaced, and the update made on the others (nothing was trained on before)."""
        while rollouts:
            batches = [rollout["batch"] for rollout in rollouts]
            metrics = self.steps.on_trainer(lambda batches=batches: self.live.actor.train(batches).wait()[0])
            if "lost" not in metrics:
                return metrics
            lost = set(metrics["lost"])
            self.state.ledger.lost(rollouts[index]["batch_id"] for index in lost)
            self._replace_dead()
            rollouts = [rollout for index, rollout in enumerate(rollouts) if index not in lost]
        return None

    def _replace_dead(self) -> None:
        """Replace whoever is gone now, if anybody (no failed call to blame)."""
        with contextlib.suppress(NobodyGone):
            self.steps.heal(NobodyGone("a rollout's env worker died"))

    # ------------------------------------------------------------------------------ training
    def _learn(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        """Drop rollouts older than ``max_staleness``, train on the rest, stage the new version
        (``prepare`` runs while the env and rollout workers keep generating)."""
        state = self.state
        stamped = [Stamped(r["versions"][0], r) for r in rollouts]
        oldest = min(s.version for s in stamped)
        fresh, dropped = filter_stale(stamped, self.learner_version, self.algo.max_staleness)
        kept = {id(s.value) for s in fresh}
        state.ledger.dropped(r["batch_id"] for r in rollouts if id(r) not in kept)
        state.dropped_batches += dropped
        state.batch_versions.append([s.version for s in stamped])
        state.returns.extend(episode for r in rollouts for episode in r["episode_returns"])
        state.env_steps += sum(r["transitions"] for r in rollouts)
        learned: dict[str, Any] = {
            "batch_version": oldest,
            "staleness": self.learner_version - oldest,
            "dropped": dropped,
        }
        metrics = self._train([s.value for s in fresh]) if fresh else None
        if metrics is not None:
            state.ledger.trained(metrics.pop("batch_ids"), iteration=state.iteration + 1)
            self._stage(int(metrics.pop("weight_version")))
            learned |= {key: round(value, 5) for key, value in metrics.items()}
        return learned

    def _record(self, learned: dict[str, Any], collect_s: float, train_s: float) -> dict[str, Any]:
        """The iteration's metrics line, as ``metrics.jsonl`` keeps it."""
        state = self.state
        if state.time_to_target_s is None and state.mean_return >= self.algo.target_return:
            state.time_to_target_s = state.training_s
        if math.isnan(state.first_mean_return):
            state.first_mean_return = state.mean_return
        return {
            "iteration": state.iteration,
            "env_steps": state.env_steps,
            "time_s": round(state.training_s, 3),
            "mean_return": state.mean_return,
            "episodes": len(state.returns),
            "batch_version": learned.pop("batch_version"),
            "learner_version": self.learner_version,
            "served_version": self.sync.version,
            "rollout_workers": len(self.live.rollout.ranks),
            "collect_s": round(collect_s, 4),
            "train_s": round(train_s, 4),
            "sync_s": round(self.sync_s["prepare_s"] + self.sync_s["pause_s"], 4),
            "pause_s": round(self.sync_s["pause_s"], 5),  # the driver's view of the commit
            "held_s": round(self.sync_s["held_s"], 5),  # the longest a rollout worker's gate was closed
            "steps_per_s": round(state.env_steps / state.training_s, 1),
        } | learned


def _timed(call: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """``call(*args)`` and the seconds it took."""
    started = time.perf_counter()
    return call(*args), time.perf_counter() - started
