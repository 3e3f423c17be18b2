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
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from examples.ppo_cartpole.config import JobConfig, env_spaces, parse_job_config
from examples.ppo_cartpole.env_worker import EnvWorker
from examples.ppo_cartpole.rollout_worker import RolloutWorker
from examples.ppo_cartpole.workers import ActorWorker
from rlinfra.driver import Batch, Job, Run, RunResult, RunState, job_main


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
    title, components, target_key = "PPO", ("actor", "rollout", "env"), "mean_return"

    def __init__(self, job: JobConfig) -> None:
        self.job, self.algo, self.settings, self.total = job, job.algo, job.run, job.algo.iterations
        self.state = PPOState(window=job.algo.return_window)
        self.spaces = env_spaces(job.algo.env_id)  # a wrong env id fails here, before Ray starts
        self.overlap = job.algo.max_staleness >= 1
        self.connected: dict[int, list[int]] = {}  # env rank -> the rollout ranks it talks to

    def launch(self, run: Run) -> None:
        algo, (obs_dim, actions) = self.algo, self.spaces
        envs = run.share(self.algo.num_envs, "env", "algo.num_envs")  # envs per env worker
        self.env = run.launch("env", EnvWorker.create_group(algo, envs, self.settings.request_timeout_s))
        version = run.start_trainer(lambda: ActorWorker.create_group(algo, obs_dim, actions))
        self.rollout = run.launch(
            "rollout", RolloutWorker.create_group(algo, obs_dim, actions), max_concurrency=2
        )
        run.connect_weights(
            self.rollout, version, lambda actor: actor.execute_on(0).export_weights().wait()[0]
        )
        self._connect(self.env.ranks)
        # PPO can go on with fewer rollout workers (the env workers share the rest), not fewer envs.
        run.supervise([self.rollout, self.env], self._rewire, shrinkable=[self.rollout])

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

    def start(self, run: Run) -> None:
        self.pending = run.generate(self.env, EnvWorker.collect, lambda rank, batch_id: (batch_id,))

    def step(self, run: Run) -> dict[str, Any]:
        state, clock, self.in_sync = self.state, time.perf_counter(), None
        rollouts = run.gather(self.pending)
        collect_s, clock = time.perf_counter() - clock, time.perf_counter()
        run.commit()  # between rollouts: nothing in flight, no batch can mix versions
        more = state.iteration + 1 < self.total
        if self.overlap and more:
            self.start(run)  # on the newest weights, while the actor trains
        fresh = run.fresh(rollouts, self.algo.max_staleness, lambda b: b.value["versions"][0])
        state.returns.extend(episode for b in rollouts for episode in b.value["episode_returns"])
        state.env_steps += sum(b.value["transitions"] for b in rollouts)
        metrics = self._train(run, fresh) or {"batch_ids": []}
        if "weight_version" in metrics:  # prepared while the env workers keep collecting
            run.stage(int(metrics.pop("weight_version")))
        train_s = time.perf_counter() - clock
        if not self.overlap:
            run.commit()
            if more:
                self.start(run)
        run.updated(metrics.pop("batch_ids"))
        if math.isnan(state.first_mean_return):
            state.first_mean_return = state.mean_return
        learned = {key: round(value, 5) for key, value in metrics.items()}
        return self._record(run, learned, collect_s, train_s)

    def _train(self, run: Run, rollouts: list[Batch]) -> dict[str, Any] | None:
        """One update; a rollout whose env worker died after making it is lost (the worker
        replaced) and the update made on the others. None when every one was lost."""
        while rollouts:
            refs = [b.value["batch"] for b in rollouts]
            metrics: dict[str, Any] = run.on_trainer(lambda refs=refs: run.trainer.train(refs).wait()[0])
            if "lost" not in metrics:
                return metrics
            run.lost([rollouts[index] for index in metrics["lost"]])  # and their dead makers replaced
            rollouts = [b for index, b in enumerate(rollouts) if index not in set(metrics["lost"])]
        return None

    def trainer_state(self, run: Run) -> bytes:
        """Data parallelism must keep every actor rank bit-identical (rank 0 alone is saved)."""
        digests = run.on_trainer(lambda: run.trainer.parameters_digest().wait())
        if len(set(digests)) != 1:
            raise RuntimeError(
                f"actor replicas diverged at iteration {self.state.iteration}: parameter digests "
                + ", ".join(f"rank {rank}: {digest[:12]}" for rank, digest in enumerate(digests))
            )
        self.in_sync = True
        return super().trainer_state(run)

    def _record(self, run: Run, learned: dict[str, Any], collect_s: float, train_s: float) -> dict[str, Any]:
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
        } | learned

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


def run(cfg: Mapping[str, Any], **options: Any) -> RunResult:
    """Place, launch and train: ``rlinfra.driver.Run``'s options (``resume``, ``cluster``,
    ``console``, ``on_iteration``, ``between_batches``: e.g. ``run.resize("rollout", remove=[1])``)."""
    return Run(PPOJob(parse_job_config(cfg)), cfg, **options).execute()


def main(cfg: Mapping[str, Any], *, resume: bool = False) -> int:
    """What ``rlinfra run`` calls: run, report, the exit status."""
    return job_main(run, cfg, resume=resume)
