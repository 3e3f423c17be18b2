"""Placing and starting the GRPO job's components: what the driver holds on the cluster.

``launch`` turns a reserved ``Layout`` into running groups — the policy (actor + reference,
fused; DDP over gloo), the generation engines, the reward workers — gives the engines the first
weights, and builds the ``WeightSync`` (engine receivers: staged on the host, loaded into the
engine's own parameters, verified there), the ``Supervisor`` (dead engines and reward workers
replaced and re-admitted) and, when the actor and the engines share devices, the ``TimeSharing``
schedule that gives them turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from examples.grpo_lm.config import JobConfig, JobConfigError, algo_dict
from examples.grpo_lm.reward import RewardWorker
from examples.grpo_lm.workers import Policy, RolloutWorker
from rlinfra import Cluster, ComponentPlacement
from rlinfra.placement import PlacementError
from rlinfra.runtime.group import WorkerGroup
from rlinfra.runtime.layout import Layout
from rlinfra.runtime.rendezvous import bring_up
from rlinfra.runtime.supervision import RestartBudget
from rlinfra.runtime.timesharing import TimeSharing
from rlinfra.services.recovery import StartTrainer
from rlinfra.services.supervisor import Supervisor
from rlinfra.services.weights import WeightSync

PLACED = ("actor", "rollout", "reward")  # what the YAML places; ``ref`` lives in actor's processes


@dataclass
class Components:
    """What a run holds on the cluster: the reserved layout and the groups launched into it."""

    layout: Layout
    policy: Any = None
    rollout: Any = None
    reward: Any = None
    supervisor: Supervisor | None = None
    turns: TimeSharing | None = None  # when actor and rollout share devices
    start_trainer: StartTrainer | None = None
    trainer_budget: RestartBudget | None = None

    def shutdown(self) -> None:
        if self.turns is not None:
            self.turns.close()
        for group in (self.reward, self.rollout, self.policy):
            if group is not None:
                group.shutdown()
        self.layout.release()


def check_shape(placement: ComponentPlacement, job: JobConfig) -> int:
    """Prompts per engine, and the job's shape checked before anything is reserved."""
    missing = [name for name in PLACED if name not in placement.components]
    if missing:
        raise PlacementError(
            f"the GRPO job needs components {', '.join(PLACED)} (ref is fused into actor); missing "
            f"{', '.join(missing)}",
            where="cluster.component_placement",
        )
    engines = placement.get_world_size("rollout")
    if job.algo.prompts_per_step % engines:
        raise JobConfigError(
            f"algo.prompts_per_step: {job.algo.prompts_per_step} prompts cannot be split evenly over "
            f"{engines} rollout engines; expected a multiple of {engines}"
        )
    return job.algo.prompts_per_step // engines


def launch(
    live: Components,
    cluster: Cluster,
    placement: ComponentPlacement,
    job: JobConfig,
    start_path: str,
    actor_checkpoint: bytes | None,
) -> WeightSync:
    """Start every group in ``live.layout`` and wire them up; returns the weight sync (which counts
    the weight version from here on). ``live.shutdown()`` releases whatever started."""
    settings, algo = job.run, algo_dict(job)
    options = {
        "layout": live.layout,
        "launch_timeout": settings.launch_timeout_s,
        "call_timeout": settings.call_timeout_s,
    }
    live.reward = RewardWorker.create_group(job.algo.format_credit).launch(
        cluster, placement.get_strategy("reward"), name="reward", **options
    )

    def start_trainer(checkpoint: bytes | None, publish_above: int | None) -> tuple[WorkerGroup, int]:
        """The policy group (actor + ref), its process group and learner; again, into the same
        bundles, when the trainer is restarted. Returns it and its weight version."""
        live.policy = Policy.create_group(actor=(algo, start_path), ref=(algo, start_path)).launch(
            cluster, placement.get_strategy("actor"), name="actor", **options
        )
        bring_up(live.policy, backend="gloo")
        version = live.policy.setup(checkpoint, publish_above).wait()[0]
        if live.turns is not None:  # a restarted trainer takes its predecessor's turns, asleep
            live.turns.rejoin(live.policy)
        return live.policy, version

    live.start_trainer = start_trainer
    live.trainer_budget = RestartBudget(placement.get_strategy("actor").restart)
    _, version = start_trainer(actor_checkpoint, None)
    # Two threads: one generates, the other stages the next version beside it.
    live.rollout = _engines(job, algo, start_path).launch(
        cluster, placement.get_strategy("rollout"), name="rollout", max_concurrency=2, **options
    )
    first = live.policy.execute_on(0).weights_state().wait()[0]
    live.rollout.set_initial_weights(first, version).wait()
    sync = WeightSync(
        live.policy,
        live.rollout,
        transport=settings.transport,
        initial_version=version,
        step_timeout_s=settings.call_timeout_s,
    )
    live.supervisor = Supervisor(
        [live.rollout, live.reward], sync, lambda replaced: None, watched=[live.policy]
    )
    if live.layout.plan.relation("actor", "rollout") == "colocated":
        live.turns = TimeSharing([live.policy, live.rollout, live.reward], awake="rollout")
    return sync


def _engines(job: JobConfig, algo: dict[str, Any], start_path: str) -> Any:
    """The rollout group to launch: the job's own sampler, or vLLM (imported only then)."""
    if job.engine.name == "vllm":
        from examples.grpo_lm.vllm_rollout import VLLMRolloutWorker

        return VLLMRolloutWorker.create_group(algo, start_path, job.engine.vllm_settings())
    return RolloutWorker.create_group(algo, start_path)


def placements(placement: ComponentPlacement) -> dict[str, list[dict[str, Any]]]:
    """Every placed component's placements as plain records: what ``rlinfra plan --json`` shows."""
    return {name: [p.to_dict() for p in placement.get_placements(name)] for name in PLACED}
