"""Placing and starting the job's three components: what the driver holds on the cluster.

``launch`` turns a reserved ``Layout`` into running groups: env, actor and rollout workers, the
trainer's process group, the first weights on every rollout worker, the env → rollout wiring and
the ``WeightSync`` that moves every later version (and counts it: the job's one weight version).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from examples.ppo_cartpole.config import JobConfig, JobConfigError
from examples.ppo_cartpole.env_worker import EnvWorker
from examples.ppo_cartpole.ppo.config import PPOConfig
from examples.ppo_cartpole.rollout_worker import RolloutWorker
from examples.ppo_cartpole.workers import ActorWorker
from rlinfra import Cluster, ComponentPlacement
from rlinfra.placement import PlacementError
from rlinfra.runtime.group import WorkerGroup
from rlinfra.runtime.layout import Layout
from rlinfra.runtime.rendezvous import bring_up
from rlinfra.runtime.supervision import RestartBudget
from rlinfra.services.recovery import StartTrainer
from rlinfra.services.supervisor import Supervisor
from rlinfra.services.weights import WeightSync

COMPONENTS = ("actor", "rollout", "env")


@dataclass
class Components:
    """What a run holds on the cluster: the reserved layout and the groups launched into it."""

    layout: Layout
    actor: Any = None
    rollout: Any = None
    env: Any = None
    supervisor: Supervisor | None = None  # replaces dead rollout and env workers (launch sets it)
    start_trainer: StartTrainer | None = None  # (re)starts the trainer group (launch sets it)
    trainer_budget: RestartBudget | None = None  # the actor's restart budget: restarts from checkpoint

    def shutdown(self) -> None:
        for group in (self.env, self.rollout, self.actor):
            if group is not None:
                group.shutdown()
        self.layout.release()


def split_envs(placement: ComponentPlacement, algo: PPOConfig) -> int:
    """Envs per env worker, and the job's shape checked before anything is reserved: the three
    components exist and the envs split evenly over the env workers."""
    missing = [name for name in COMPONENTS if name not in placement.components]
    if missing:
        raise PlacementError(
            f"the PPO job needs components {', '.join(COMPONENTS)}; missing {', '.join(missing)}",
            where="cluster.component_placement",
        )
    num_env_workers = placement.get_world_size("env")
    if algo.num_envs % num_env_workers:
        raise JobConfigError(
            f"algo.num_envs: {algo.num_envs} envs cannot be split evenly over {num_env_workers} env "
            f"workers; expected a multiple of {num_env_workers}"
        )
    return algo.num_envs // num_env_workers


def launch(
    live: Components,
    cluster: Cluster,
    placement: ComponentPlacement,
    job: JobConfig,
    spaces: tuple[int, int],
    envs_per_worker: int,
    actor_checkpoint: bytes | None,
) -> WeightSync:
    """Start every group in ``live.layout`` and wire them up; ``actor_checkpoint`` restores the
    trainer. Returns the weight sync from actor to rollout, which counts the weight version from
    here on. On failure the caller's ``live.shutdown()`` releases whatever started."""
    settings = job.run
    obs_dim, num_actions = spaces
    algo_dict = dataclasses.asdict(job.algo)
    options = {
        "layout": live.layout,
        "launch_timeout": settings.launch_timeout_s,
        "call_timeout": settings.call_timeout_s,
    }
    live.env = EnvWorker.create_group(algo_dict, envs_per_worker, settings.request_timeout_s).launch(
        cluster, placement.get_strategy("env"), name="env", **options
    )

    def start_trainer(checkpoint: bytes | None, publish_above: int | None) -> tuple[WorkerGroup, int]:
        """The trainer group, its process group and its model (restored from ``checkpoint``);
        again, into the same bundles, when the trainer is restarted. Returns it and its weight version."""
        live.actor = ActorWorker.create_group(algo_dict, obs_dim, num_actions).launch(
            cluster, placement.get_strategy("actor"), name="actor", **options
        )
        bring_up(live.actor, backend="gloo")
        return live.actor, live.actor.setup(checkpoint, publish_above).wait()[0]  # non-zero after a resume

    live.start_trainer = start_trainer
    live.trainer_budget = RestartBudget(placement.get_strategy("actor").restart)
    _, version = start_trainer(actor_checkpoint, None)
    # Two threads: one serves the env workers, the other stages the next weights.
    live.rollout = RolloutWorker.create_group(algo_dict, obs_dim, num_actions).launch(
        cluster, placement.get_strategy("rollout"), name="rollout", max_concurrency=2, **options
    )
    first = live.actor.execute_on(0).export_weights().wait()[0]
    live.rollout.set_initial_weights(first, version).wait()
    connected: dict[int, list[int]] = {}  # env rank -> the rollout ranks it talks to
    _connect(live.env, live.rollout, live.env.ranks, connected)
    sync = WeightSync(
        live.actor,
        live.rollout,
        transport=settings.transport,
        initial_version=version,
        step_timeout_s=settings.call_timeout_s,
    )

    def rewire(replaced: dict[str, list[int]]) -> None:
        affected = _affected_env_ranks(live.env, live.rollout, replaced, connected)
        _connect(live.env, live.rollout, affected, connected)

    # PPO can go on with fewer rollout workers (the env workers share the rest), not fewer envs.
    live.supervisor = Supervisor(
        [live.rollout, live.env], sync, rewire, watched=[live.actor], shrinkable=[live.rollout]
    )
    return sync


def _rollouts_of(env_rank: int, env: Any, rollout: Any) -> list[int]:
    """Each env worker talks to its own share of the running rollout workers: with more rollout
    workers than env workers its envs are split among several, otherwise they are shared."""
    running = rollout.ranks
    count_env, count_rollout = env.world_size, len(running)
    if count_rollout >= count_env:
        return [r for i, r in enumerate(running) if i % count_env == env_rank]
    return [running[env_rank % count_rollout]]


def _connect(env: Any, rollout: Any, env_ranks: list[int], connected: dict[int, list[int]]) -> None:
    """Give ``env_ranks`` the handles of their rollout workers (again, after replacements);
    ``connected`` records who talks to whom."""
    for rank in env_ranks:
        mine = _rollouts_of(rank, env, rollout)
        env.execute_on(rank).connect([(f"rollout:{r}", rollout.actors[r]) for r in mine]).wait()
        connected[rank] = mine


def _affected_env_ranks(
    env: Any, rollout: Any, changed: dict[str, list[int]], connected: dict[int, list[int]]
) -> list[int]:
    """Env workers that were replaced, talk to a rollout worker that was, or whose share of the
    rollout workers changed (some were removed or added)."""
    new_rollouts = set(changed.get(rollout.name, []))
    return [
        rank
        for rank in env.ranks
        if rank in changed.get(env.name, [])
        or connected.get(rank) != _rollouts_of(rank, env, rollout)
        or new_rollouts & set(connected.get(rank, []))
    ]


def placements(placement: ComponentPlacement) -> dict[str, list[dict[str, Any]]]:
    """Every component's placements as plain records: what ``rlinfra plan --json`` shows."""
    return {name: [p.to_dict() for p in placement.get_placements(name)] for name in COMPONENTS}


def misplaced_bundles(layout: Layout) -> list[str]:
    """Ranks whose bundle Ray put on another node than planned (expected: none)."""
    return [
        f"{name}:{row.rank} planned on node {row.planned_node_rank}, placed on {row.node_rank}"
        for name in COMPONENTS
        for row in layout.bundle_report(name)
        if not row.matches
    ]


def relations(layout: Layout) -> dict[str, str]:
    """How the components share hardware (``colocated``, ``disaggregated``, …), for placement.json."""
    return {
        "actor-rollout": layout.plan.relation("actor", "rollout"),
        "rollout-env": layout.plan.relation("rollout", "env"),
    }
