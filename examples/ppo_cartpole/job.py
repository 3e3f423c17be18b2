"""The main job: PPO on CartPole, its three components placed by a YAML config, on ``rlinfra.driver``.

One iteration with ``algo.max_staleness: 1`` (the default):

    wait for rollout k            made entirely with weight version v (checked, stamped)
    commit v+1 if staged          pause → swap → verify → resume, between rollouts: nothing in flight
    start rollout k+1             on the newest weights; runs while the actor trains on rollout k
    train on rollout k            2 data-parallel ranks; version v+1 → v+2
    prepare v+2                   staged into the rollout workers while rollout k+1 goes on

With ``max_staleness: 0`` the loop is strictly on-policy: collect, train, update, repeat. Faults,
checkpoints, ``--resume``, metrics and Ctrl-C are the driver's (``rlinfra.driver.Run``).

    rlinfra run examples/ppo_cartpole/disaggregated.yaml [algo.iterations=50 ...] [--resume]

or in Python, ``PPOJob.run(cfg)`` (``rlinfra.driver.Run``'s options: ``resume``, ``cluster``,
``console``, ``on_iteration``, ``between_batches``: e.g. ``run.resize("rollout", remove=[1])``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from examples.ppo_cartpole.config import JobConfig, env_spaces
from examples.ppo_cartpole.env_worker import EnvWorker
from examples.ppo_cartpole.rollout_worker import RolloutWorker
from examples.ppo_cartpole.workers import ActorWorker
from rlinfra import WorkerGroup
from rlinfra.driver import Job, Run, RunResult, RunState


@dataclass
class PPOState(RunState):
    CHECKPOINTED: ClassVar = (*RunState.CHECKPOINTED, "env_steps", "returns")

    window: int = 100  # the mean return is over the last ``window`` episodes
    returns: list[float] = field(default_factory=list)
    env_steps: int = 0
    first_mean_return: float = math.nan  # after this process's first iteration

    @property
    def mean_return(self) -> float:
        last = self.returns[-self.window :]
        return sum(last) / len(last) if last else math.nan


class PPOJob(Job):
    title, components, target_key, Config = "PPO", ("actor", "rollout", "env"), "mean_return", JobConfig

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__(cfg)
        self.algo = self.config.algo
        self.state = PPOState(window=self.algo.return_window)
        self.spaces = env_spaces(self.algo.env_id)  # a wrong env id fails here, before Ray starts
        self.connected: dict[int, list[int]] = {}  # env rank -> the rollout ranks it talks to

    def loop(self, run: Run) -> None:
        algo, (obs_dim, actions), state = self.algo, self.spaces, self.state
        envs = run.per_rank(algo.num_envs, "env", "algo.num_envs")  # envs per env worker
        self.env = run.launch("env", EnvWorker.create_group(algo, envs, self.settings.request_timeout_s))
        actor = run.start_trainer(lambda: ActorWorker.create_group(algo, obs_dim, actions))
        self.rollout = run.launch(
            "rollout", RolloutWorker.create_group(algo, obs_dim, actions), max_concurrency=2
        )
        self._connect(self.env.ranks)
        # PPO can go on with fewer rollout workers (the env workers share the rest), not fewer envs.
        run.supervise(self._rewire, shrinkable=[self.rollout])
        rollouts, overlap = run.batches(self.env, EnvWorker.collect), algo.max_staleness >= 1
        for step in run.steps(algo.iterations):
            clock, self.in_sync = time.perf_counter(), None
            batches = rollouts.gather()
            collect_s, clock = time.perf_counter() - clock, time.perf_counter()
            if overlap:
                run.commit()  # between rollouts: nothing in flight, no batch can mix versions
                if not step.last:
                    rollouts.issue()  # on the newest weights, while the actor trains
            state.returns.extend(episode for b in batches for episode in b.payload["episode_returns"])
            state.env_steps += sum(b.payload["transitions"] for b in batches)
            step.train(actor.train, step.drop_stale(batches, algo.max_staleness))  # v+1 staged meanwhile
            train_s = time.perf_counter() - clock
            if not overlap:
                run.commit()
                if not step.last:
                    rollouts.issue()
            if math.isnan(state.first_mean_return):
                state.first_mean_return = state.mean_return
            step.log(**self._record(run, collect_s, train_s))

    def _rollouts_of(self, env_rank: int) -> list[int]:
        """Each env worker talks to its share of the running rollout workers."""
        running, count_env = self.rollout.ranks, self.env.world_size
        if len(running) >= count_env:
            return [r for i, r in enumerate(running) if i % count_env == env_rank]
        return [running[env_rank % len(running)]]

    def _connect(self, env_ranks: list[int]) -> None:
        for rank in env_ranks:
            mine = self._rollouts_of(rank)
            self.env.execute_on(rank).connect([(f"rollout:{r}", self.rollout.actors[r]) for r in mine]).wait()
            self.connected[rank] = mine

    def _rewire(self, changed: dict[str, list[int]]) -> None:
        """Env workers replaced, talking to a replaced rollout worker, or whose share changed."""
        new = set(changed.get("rollout", []))
        self._connect(
            [
                rank
                for rank in self.env.ranks
                if rank in changed.get("env", [])
                or self.connected.get(rank) != self._rollouts_of(rank)
                or new & set(self.connected.get(rank, []))
            ]
        )

    def trainer_state(self, run: Run, group: WorkerGroup) -> bytes:
        """Data parallelism must keep every actor rank bit-identical (rank 0 alone is saved)."""
        digests = run.call_trainer(lambda: group.parameters_digest().wait())
        if len(set(digests)) != 1:
            raise RuntimeError(
                f"actor replicas diverged at iteration {self.state.iteration}: parameter digests "
                + ", ".join(f"rank {rank}: {digest[:12]}" for rank, digest in enumerate(digests))
            )
        self.in_sync = True
        return super().trainer_state(run, group)

    def _record(self, run: Run, collect_s: float, train_s: float) -> dict[str, Any]:
        state, sync_s = self.state, run.sync_s
        return {
            "env_steps": state.env_steps,
            "mean_return": state.mean_return,
            "episodes": len(state.returns),
            "rollout_workers": len(self.rollout.ranks),
            "collect_s": round(collect_s, 4),
            "train_s": round(train_s, 4),
            "sync_s": round(sync_s["prepare_s"] + sync_s["pause_s"], 4),
            "steps_per_s": round(state.env_steps / max(state.training_s, 1e-9), 1),
            "replicas_in_sync": getattr(self, "in_sync", None),
        }

    def target(self) -> float:
        return self.algo.target_return

    def line(self, record: dict[str, Any]) -> str:
        return (
            f"iter {record['iteration']:3d} | steps {record['env_steps']:6d} | return "
            f"{record['mean_return']:6.1f} | batch v{record['batch_version']} → learner "
            f"v{record['learner_version']} | serving v{record['served_version']} | collect "
            f"{record['collect_s']:.2f} s train {record['train_s']:.2f} s "
            f"sync {record['sync_s'] * 1e3:.0f} ms"
        )

    def outcome(self, result: RunResult) -> dict[str, Any]:
        return {"mean_return": self.state.mean_return, "env_steps": self.state.env_steps}

    def report(self, result: RunResult) -> list[str]:
        state = self.state
        return [
            f"mean return {state.mean_return:.1f} over the last {self.algo.return_window} episodes | "
            f"{state.env_steps} env steps | {state.env_steps / max(state.training_s, 1e-9):.0f} steps/s"
        ]
