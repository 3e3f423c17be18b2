"""The main job, colocated config (actor and rollout sharing two logical GPUs of one node)."""

from __future__ import annotations

import json

import pytest

from examples.ppo_cartpole.job import PPOJob
from rlinfra.driver import read_metrics
from tests.examples.job_checks import assert_resources_released, job_config, planned_placements

CFG = job_config("colocated")
pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster(CFG)]
ITERATIONS = 4


def test_short_run_places_syncs_and_learns(cluster, tmp_path) -> None:
    cfg = job_config("colocated", f"algo.iterations={ITERATIONS}", f"run.output_dir={tmp_path}")
    result = PPOJob.run(cfg, cluster=cluster)

    assert result.placements == planned_placements("colocated")
    actor, rollout = result.placements["actor"], result.placements["rollout"]
    assert [p["visible_devices"] for p in actor] == [p["visible_devices"] for p in rollout] == ["0", "1"]
    assert json.loads((tmp_path / "placement.json").read_text())["relations"]["actor-rollout"] == (
        "colocated"
    )
    assert result.misplaced_bundles == []
    assert result.state.served_versions == list(range(ITERATIONS))
    assert all(len(set(versions)) == 1 for versions in result.state.batch_versions)
    assert result.state.dropped_batches == 0
    assert result.state.mean_return > 1.3 * result.state.first_mean_return
    assert_resources_released()


def test_strictly_on_policy_mode_trains_on_fresh_batches_only(cluster, tmp_path) -> None:
    cfg = job_config("colocated", "algo.iterations=3", "algo.max_staleness=0", f"run.output_dir={tmp_path}")
    result = PPOJob.run(cfg, cluster=cluster)
    records = read_metrics(tmp_path)
    # Collect, train, update, repeat: each batch comes from the version the learner is at.
    assert [r["staleness"] for r in records] == [0, 0, 0]
    assert [versions[0] for versions in result.state.batch_versions] == [0, 1, 2]
    assert result.state.served_versions == [0, 1, 2, 3]
    assert_resources_released()
