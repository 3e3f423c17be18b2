"""The GRPO job, colocated config, on its own simulated cluster (1 node x 2 logical GPUs).

The actor and the engines share both GPUs and take turns (``rlinfra.runtime.timesharing``): the
engines generate, sleep while the actor trains, get the next version staged and loaded while
asleep, and wake for the next batch. Checked: the placement is the planned one, the phases
alternate in that order and are timed, every batch is on-policy, and a call that reaches the
sleeping actor is refused by the worker itself.
"""

from __future__ import annotations

import pytest
import ray

from examples.grpo_lm.job import run
from rlinfra.runtime.timesharing import ComponentAsleepError
from rlinfra.services.metrics import read_metrics
from tests.examples.job_checks import (
    GRPO_TINY_WARMUP,
    assert_resources_released,
    job_config,
    planned_placements,
)

pytestmark = pytest.mark.timeout(600)

CFG = job_config("colocated", example="grpo_lm")


def test_short_run_takes_turns_on_the_shared_devices_and_stays_on_policy(cluster, tmp_path) -> None:
    refusals: list[str] = []

    def call_the_sleeping_actor(record: dict) -> None:
        if record["iteration"] == 2:  # the engines' turn: the actor is asleep
            actor = ray.get_actor("actor:0")
            with pytest.raises(ray.exceptions.RayTaskError) as caught:
                ray.get(actor.rlinfra_role_call.remote("actor", "weights", (), {}), timeout=30)
            assert isinstance(caught.value.cause, ComponentAsleepError)
            refusals.append(str(caught.value.cause))

    updates = 4
    cfg = job_config(
        "colocated",
        f"algo.updates={updates}",
        "algo.eval_every=2",
        "algo.eval_size=100",
        "algo.stop_at_target=false",
        *GRPO_TINY_WARMUP,
        f"run.output_dir={tmp_path}",
        example="grpo_lm",
    )
    result = run(cfg, cluster=cluster, on_iteration=call_the_sleeping_actor)

    assert not result.interrupted and result.iterations == updates
    assert result.placements == planned_placements("colocated", example="grpo_lm")
    assert result.relation == "colocated"
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
    assert result.state.served_versions == list(range(updates + 1))
    assert refusals and "component 'actor' is asleep" in refusals[0]
    assert_resources_released()
