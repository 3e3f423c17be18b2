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

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console

from examples.ppo_cartpole.config import JobConfig, JobConfigError, env_spaces, parse_job_config
from examples.ppo_cartpole.env_worker import EnvWorker
from examples.ppo_cartpole.rollout_worker import RolloutWorker
from examples.ppo_cartpole.workers import ActorWorker
from rlinfra.driver import Batch, Job, Run, RunResult, RunState, job_main, plot_curve


@dataclass
class PPOState(RunState):
    CHECKPOINTED: ClassVar = (*RunState.CHECKPOINTED, "env_steps", "time_to_target_s", "returns")

    window: int = 100  # the mean return is over the last ``window`` episodes
    returns: list[float] = field(default_factory=list)
    env_steps: int = 0
    time_to_target_s: float | None = None
    first_mean_return: float = math.nan  # after this process's first iteration

    @property
    def mean_return(self) -> float:
        last = self.returns[-self.window :]
        return sum(last) / len(last) if last else math.nan


@dataclass
class RolloutScaling:
    """Handed to ``run(between_rollouts=...)`` once per iteration, when no rollout is in flight:
    remove rollout workers or add removed ones back (admitted at the served version)."""

    iteration: int
    run: Run
    rollout: Any

    @property
    def ranks(self) -> list[int]:
        return list(self.rollout.ranks)

    def remove(self, ranks: list[int]) -> None:
        self.run.resize(self.rollout, remove=ranks)

    def add(self, ranks: list[int]) -> None:
        self.run.resize(self.rollout, add=ranks)


class PPOJob(Job):
    title, components = "PPO", ("actor", "rollout", "env")

    def __init__(self, job: JobConfig, between_rollouts: Callable[[RolloutScaling], None] | None) -> None:
        self.job, self.algo, self.settings = job, job.algo, job.run
        self.total, self.between_rollouts = job.algo.iterations, between_rollouts
        self.state = PPOState(window=job.algo.return_window)
        self.spaces = env_spaces(job.algo.env_id)  # a wrong env id fails here, before Ray starts
        self.overlap = job.algo.max_staleness >= 1
        self.connected: dict[int, list[int]] = {}  # env rank -> the rollout ranks it talks to

    def check(self, run: Run) -> None:
        envs = run.placement.get_world_size("env")
        if self.algo.num_envs % envs:
            raise JobConfigError(
                f"algo.num_envs: {self.algo.num_envs} envs cannot be split evenly over {envs} env "
                f"workers; expected a multiple of {envs}"
            )

    def launch(self, run: Run) -> None:
        algo, (obs_dim, actions) = dataclasses.asdict(self.algo), self.spaces
        envs = self.algo.num_envs // run.placement.get_world_size("env")
        self.env = run.launch("env", EnvWorker.create_group(algo, envs, self.settings.request_timeout_s))
        version = run.start_trainer(lambda: ActorWorker.create_group(algo, obs_dim, actions))
        self.rollout = run.launch(
            "rollout", RolloutWorker.create_group(algo, obs_dim, actions), max_concurrency=2
        )
        run.connect_weights(
            self.rollout, lambda actor: actor.execute_on(0).export_weights().wait()[0], version
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
        if self.between_rollouts is not None:  # nothing in flight: rollout workers may come and go
            self.between_rollouts(RolloutScaling(state.iteration, run, self.rollout))
        run.commit()  # between rollouts: nothing in flight, no batch can mix versions
        more = state.iteration + 1 < self.total
        if self.overlap and more:
            self.start(run)  # on the newest weights, while the actor trains
        fresh = run.fresh(rollouts, self.algo.max_staleness, lambda b: b.value["versions"][0])
        oldest = min(state.batch_versions[-1])
        learned = {"batch_version": oldest, "staleness": run.learner_version - oldest}
        learned["dropped"] = len(rollouts) - len(fresh)
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
        run.tick()
        if state.time_to_target_s is None and state.mean_return >= self.algo.target_return:
            state.time_to_target_s = state.training_s
        run.updated(metrics.pop("batch_ids"))
        if math.isnan(state.first_mean_return):
            state.first_mean_return = state.mean_return
        learned |= {key: round(value, 5) for key, value in metrics.items()}
        return self._record(run, learned, collect_s, train_s)

    def _train(self, run: Run, rollouts: list[Batch]) -> dict[str, Any] | None:
        """One update; a rollout whose env worker died after making it is lost (the worker
        replaced) and the update made on the others. None when every one was lost."""
        while rollouts:
            refs = [b.value["batch"] for b in rollouts]
            metrics: dict[str, Any] = run.on_trainer(lambda refs=refs: run.trainer.train(refs).wait()[0])
            if "lost" not in metrics:
                return metrics
            run.lost([rollouts[index] for index in metrics["lost"]])
            run.replace_dead()
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
            "iteration": state.iteration,
            "env_steps": state.env_steps,
            "time_s": round(state.training_s, 3),
            "mean_return": state.mean_return,
            "episodes": len(state.returns),
            "learner_version": run.learner_version,
            "served_version": run.served_version,
            "rollout_workers": len(self.rollout.ranks),
            "collect_s": round(collect_s, 4),
            "train_s": round(train_s, 4),
            "sync_s": round(sync_s["prepare_s"] + sync_s["pause_s"], 4),
            "pause_s": round(sync_s["pause_s"], 5),  # the driver's view of the commit
            "held_s": round(sync_s["held_s"], 5),  # the longest a rollout worker's gate was closed
            "steps_per_s": round(state.env_steps / max(state.training_s, 1e-9), 1),
            "replicas_in_sync": getattr(self, "in_sync", None),
        } | learned

    def reached(self, record: dict[str, Any]) -> bool:
        return bool(record["mean_return"] >= self.algo.target_return)

    def line(self, record: dict[str, Any]) -> str:
        return (
            f"iter {record['iteration']:3d} | steps {record['env_steps']:6d} | return "
            f"{_num(record['mean_return'])} | batch v{record['batch_version']} → learner "
            f"v{record['learner_version']} | serving v{record['served_version']} | collect "
            f"{record['collect_s']:.2f} s train {record['train_s']:.2f} s "
            f"sync {record['sync_s'] * 1e3:.0f} ms"
        )

    def outcome(self, result: RunResult) -> dict[str, Any]:
        state = self.state
        return {
            "mean_return": state.mean_return,
            "env_steps": state.env_steps,
            "time_to_target_s": state.time_to_target_s,
        }

    def report(self, result: RunResult) -> list[str]:
        state, target = self.state, f"{self.algo.target_return:g}"
        ttt = f"{state.time_to_target_s:.1f} s" if state.time_to_target_s is not None else "—"
        window = f"last {self.algo.return_window} episodes: {state.mean_return:.1f}"
        head = {
            "interrupted": f"interrupted after iteration {state.iteration}; continue with --resume",
            "target": f"reached mean return {target} ({window})",
        }.get(
            result.outcome, f"did NOT reach mean return {target} in {state.iteration} iterations ({window})"
        )
        steps_per_s = state.env_steps / state.training_s if state.training_s > 0 else 0.0
        return [
            head,
            f"time-to-{target}: {ttt} training ({result.wall_s:.1f} s wall, with Ray start and launch) | "
            f"{state.iteration} iterations | {state.env_steps} env steps | {steps_per_s:.0f} steps/s",
        ]

    def plot(self, records: list[dict[str, Any]], folder: Path) -> Path | None:
        title = f"PPO {self.algo.env_id}: {self.job.name or folder.name}"
        xs = (("env_steps", "environment steps"), ("time_s", "seconds"))
        target = (self.algo.target_return, f"target {self.algo.target_return:g}")
        return plot_curve(
            records, folder / PLOT_FILE, ("mean_return", "mean episode return"), xs, target, title
        )


PLOT_FILE = "learning_curve.png"


def _num(value: float | None) -> str:
    return "   n/a" if value is None or math.isnan(value) else f"{value:6.1f}"


def run(
    cfg: Mapping[str, Any],
    *,
    resume: bool = False,
    cluster: Any = None,
    console: Console | None = None,
    on_iteration: Callable[[dict[str, Any]], None] | None = None,
    between_rollouts: Callable[[RolloutScaling], None] | None = None,
) -> RunResult:
    """Place, launch and train (see ``rlinfra.driver.Run``); ``between_rollouts`` may remove or
    add rollout workers once per iteration (elastic rollout)."""
    job = PPOJob(parse_job_config(cfg), between_rollouts)
    return Run(job, cfg, resume=resume, cluster=cluster, console=console, on_iteration=on_iteration).execute()


def main(cfg: Mapping[str, Any], *, resume: bool = False) -> int:
    """What ``rlinfra run`` calls: run, report, the exit status."""
    return job_main(run, cfg, resume=resume)
