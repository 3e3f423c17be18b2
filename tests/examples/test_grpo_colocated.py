"""The GRPO job, colocated config, on its own simulated cluster (1 node x 2 logical GPUs).

The actor and the engines share both GPUs and take turns (``rlinfra.runtime.timesharing``): the
engines generate, sleep while the actor trains, get the next version staged and loaded while
asleep, and wake for the next batch. Checked: the placement is the planned one, the phases
alternate in that order and are timed, every batch is on-policy, the reward rises, and a call that reaches the
sleeping actor is refused by the worker itself.
"""

from __future__ import annotations

import pytest
import ray

from examples.grpo_lm.job import GRPOJob
from rlinfra.driver.metrics import read_metrics
from rlinfra.runtime.timesharing import ComponentAsleepError
from tests.examples.job_checks import (
    GRPO_TINY_WARMUP,
    assert_resources_released,
    assert_reward_improves,
    grpo_config,
    job_config,
    planned_placements,
    sigkill,
)

CFG = job_config("colocated", example="grpo_lm")
pytestmark = [pytest.mark.timeout(600), pytest.mark.cluster(CFG)]


def test_short_run_takes_turns_on_the_shared_devices_stays_on_policy_and_learns(cluster, tmp_path) -> None:
    refusals: list[str] = []

    def call_the_sleeping_actor(record: dict) -> None:
        if record["iteration"] == 2:  # the engines' turn: the actor is asleep
            actor = ray.get_actor("actor:0")
            with pytest.raises(ray.exceptions.RayTaskError) as caught:
                ray.get(actor.rlinfra_role_call.remote("actor", "weights", (), {}), timeout=30)
            assert isinstance(caught.value.cause, ComponentAsleepError)
            refusals.append(str(caught.value.cause))

    updates = 60
    cfg = grpo_config("colocated", tmp_path, f"algo.updates={updates}", "algo.eval_every=30")
    result = GRPOJob.run(cfg, cluster=cluster, on_iteration=call_the_sleeping_actor)

    assert not result.interrupted and result.iterations == updates
    assert result.placements == planned_placements("colocated", example="grpo_lm")
    assert result.relations["actor-rollout"] == "colocated"
    # The schedule: everyone asleep, the engines woken; then per update actor, then engines.
    assert result.phases[:3] == [("actor", "sleep"), ("rollout", "sleep"), ("rollout", "wake")]
    turns = result.phases[3:]
    assert (
        turns == [("rollout", "sleep"), ("actor", "wake"), ("actor", "sleep"), ("rollout", "wake")] * updates
    )
    assert result.switches["switches"] == 1 + 2 * updates and result.switches["total_p50_s"] > 0
    records = read_metrics(tmp_path)
    assert all(r["switch_s"] > 0 for r in records)
    # Strictly on-policy: each batch made with the version trained on, then that version served.
    assert [r["staleness"] for r in records] == [0] * updates
    assert_reward_improves(records)
    assert result.state.served_versions == list(range(updates + 1))
    assert refusals and "component 'actor' is asleep" in refusals[0]
    assert_resources_released()


def test_a_trainer_restarted_after_a_lost_rank_rejoins_the_turns_asleep(cluster, tmp_path) -> None:
    killed: list[int] = []

    def kill_trainer_rank_one(record: dict) -> None:
        if record["iteration"] == 3 and not killed:  # the engines' turn; the actor's is next
            killed.append(sigkill("actor:1"))

    updates = 4
    overrides = (f"algo.updates={updates}", "algo.eval_every=2", "run.checkpoint_every=2", *GRPO_TINY_WARMUP)
    cfg = grpo_config("colocated", tmp_path, *overrides, start=None)
    result = GRPOJob.run(cfg, cluster=cluster, on_iteration=kill_trainer_rank_one)

    assert killed and result.iterations == updates
    (restart,) = result.state.trainer_restarts
    assert (restart.component, restart.outcome) == ("actor", "restarted")
    assert restart.detail == "from the checkpoint of update 2"
    assert [r["iteration"] for r in read_metrics(tmp_path)] == list(range(1, updates + 1))
    # Replaying the hooks that ran: the actor and the engines were never awake at once, the
    # restarted actor's first hook was a sleep, and the turns went on after it.
    awake: set[str] = set()
    for component, action in result.phases:
        awake = awake | {component} if action == "wake" else awake - {component}
        assert awake != {"actor", "rollout"}, result.phases
    # The actor's switch that found rank 1 dead put the engines to sleep and stopped there; the
    # restarted actor came in asleep; then the engines' turn, and the updates went on.
    kill_at = 3 + 4 * 3
    assert result.phases[kill_at : kill_at + 3] == [
        ("rollout", "sleep"),
        ("actor", "sleep"),
        ("rollout", "wake"),
    ]
    assert result.state.served_versions == sorted(set(result.state.served_versions))
    assert result.state.ledger.summary()["rolled_back"] == 2  # update 3: one batch per engine
    assert_resources_released()
