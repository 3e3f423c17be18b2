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

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from examples.ppo_cartpole import reporting
from examples.ppo_cartpole.config import JobConfig
from examples.ppo_cartpole.console import iteration_display
from examples.ppo_cartpole.launch import Components
from examples.ppo_cartpole.ppo.config import PPOConfig
from examples.ppo_cartpole.signals import CtrlC
from examples.ppo_cartpole.state import DriverState
from rlinfra.services.weights import Stamped, WeightSync, filter_stale
from rlinfra.services.weights.barrier import Prepared


def train(
    live: Components,
    sync: WeightSync,
    job: JobConfig,
    state: DriverState,
    log: reporting.MetricsLog,
    console: Console,
    on_iteration: Callable[[dict[str, Any]], None] | None,
) -> bool:
    """Iterate, and after each iteration: log, checkpoint, show progress. True once the target
    return is reached; False when the iteration budget ran out first."""
    ctrl_c = CtrlC()
    with ctrl_c.watching(), iteration_display(console, job.algo.iterations, state.iteration) as show:
        for record in TrainingLoop(live, sync, job.algo, state).iterations():
            checkpointing = state.iteration % job.run.checkpoint_every == 0
            if checkpointing:
                record["replicas_in_sync"] = replicas_in_sync(live, state.iteration)
            log.write(record)
            if checkpointing:
                actor_state = live.actor.execute_on(0).checkpoint().wait()[0]
                reporting.save_checkpoint(Path(job.run.output_dir), actor_state, state.checkpointed())
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


class TrainingLoop:
    """Rollouts in, one update per iteration, new weights out; each iteration yields its record."""

    def __init__(self, live: Components, sync: WeightSync, algo: PPOConfig, state: DriverState) -> None:
        self.live, self.sync, self.algo, self.state = live, sync, algo, state
        self.overlap = algo.max_staleness >= 1
        self.staged: Prepared | None = None  # trained and staged on the rollout workers, not yet served
        self.sync_s = {"prepare_s": 0.0, "pause_s": 0.0, "held_s": 0.0}
        state.served_versions.append(sync.version)

    def iterations(self) -> Iterator[dict[str, Any]]:
        """Run until the iteration budget (the caller stops at the target return)."""
        state, algo, env = self.state, self.algo, self.live.env
        clock = time.perf_counter()
        pending = env.collect()
        while state.iteration < algo.iterations:
            rollouts, collect_s = _timed(pending.wait)
            self._commit_staged()  # between rollouts: nothing in flight, no batch can mix versions
            more = state.iteration + 1 < algo.iterations
            if self.overlap and more:
                pending = env.collect()  # on the newest weights, while the actor trains
            learned, train_s = _timed(self._learn, rollouts)
            if not self.overlap:
                self._commit_staged()
                if more:
                    pending = env.collect()
            now = time.perf_counter()
            state.training_s += now - clock
            clock = now
            state.iteration += 1
            yield self._record(learned, collect_s, train_s)

    @property
    def learner_version(self) -> int:
        """The trainer's weight version: the one staged, if any, else the one served."""
        return self.staged.version if self.staged is not None else self.sync.version

    def _commit_staged(self) -> None:
        """Pause → swap → verify → resume for the version staged last iteration, if any."""
        if self.staged is not None:
            report = self.sync.commit(self.staged)
            self.sync_s["pause_s"], self.sync_s["held_s"] = report.pause_s, report.held_s
            self.state.served_versions.append(self.sync.version)
            self.staged = None

    def _learn(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        """Drop rollouts older than ``max_staleness``, train on the rest, stage the new version
        (``prepare`` runs while the env and rollout workers keep generating)."""
        state = self.state
        stamped = [Stamped(r["versions"][0], r["batch"]) for r in rollouts]
        oldest = min(s.version for s in stamped)
        fresh, dropped = filter_stale(stamped, self.learner_version, self.algo.max_staleness)
        state.dropped_batches += dropped
        state.batch_versions.append([s.version for s in stamped])
        state.returns.extend(episode for r in rollouts for episode in r["episode_returns"])
        state.env_steps += sum(r["transitions"] for r in rollouts)
        learned: dict[str, Any] = {
            "batch_version": oldest,
            "staleness": self.learner_version - oldest,
            "dropped": dropped,
        }
        if fresh:
            metrics = self.live.actor.train([s.value for s in fresh]).wait()[0]
            self.staged = self.sync.prepare(int(metrics.pop("weight_version")))
            self.sync_s["prepare_s"] = self.staged.prepare_s
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
