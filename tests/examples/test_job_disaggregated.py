"""The main job, disaggregated config, on its own simulated cluster (2 nodes x 4 logical GPUs).

Short runs (a few PPO iterations) check what the full run relies on: the placement is the one
``rlinfra plan`` shows, every iteration advances the weight version through the barrier, no batch
mixes versions, the return improves, and every Ray resource is released after the run. Ctrl-C
and ``--resume`` are tested with the faults (``test_job_faults``), in the same config.
"""

from __future__ import annotations

import json

import pytest
import ray

from examples.ppo_cartpole.job import PPOJob
from rlinfra.driver import JobConfigError, read_metrics
from tests.examples.job_checks import (
    assert_resources_released,
    job_config,
    planned_placements,
    read_tensorboard,
)

CFG = job_config("disaggregated")
pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster(CFG)]
ITERATIONS = 5


# Run inside an env worker: which heavy modules its process has imported. Defined from source so
# that Ray ships it by value (a function of this module would make the worker import this module,
# and with it the job and torch).
_IMPORTED_SOURCE = """
def imported(worker):
    import sys
    return sorted(name for name in ("torch", "transformers") if name in sys.modules)
"""


def _imported_in(actor_name: str) -> list[str]:
    namespace: dict = {"__name__": "imported_probe"}
    exec(_IMPORTED_SOURCE, namespace)
    return ray.get(ray.get_actor(actor_name).__ray_call__.remote(namespace["imported"]), timeout=30)


def test_short_run_places_syncs_and_learns(cluster, tmp_path) -> None:
    heavy_in_env_workers: list[list[str]] = []

    def look_into_the_env_workers(record: dict) -> None:
        if record["iteration"] == ITERATIONS:  # connected to the rollout workers, and collected
            heavy_in_env_workers.extend(_imported_in(f"env:{rank}") for rank in range(2))

    cfg = job_config("disaggregated", f"algo.iterations={ITERATIONS}", f"run.output_dir={tmp_path}")
    result = PPOJob.run(cfg, cluster=cluster, on_iteration=look_into_the_env_workers)

    assert not result.interrupted and result.iterations == ITERATIONS
    assert result.placements == planned_placements("disaggregated")
    assert result.misplaced_bundles == []
    # One committed version per iteration after the first (the first rollout runs on version 0
    # while version 1 trains), each exactly one higher: the barrier never skipped or repeated one.
    assert result.state.served_versions == list(range(ITERATIONS))
    records = read_metrics(tmp_path)
    assert [r["learner_version"] for r in records] == list(range(1, ITERATIONS + 1))
    # Both data-parallel actor ranks held bit-identical parameters after every update.
    assert all(r["replicas_in_sync"] for r in records)
    # From the second iteration on a version was committed: the rollout workers' gate was closed
    # for a while, inside the driver's pause window.
    assert all(0 < r["held_s"] < r["pause_s"] for r in records[1:])
    # Every env worker's batch came from one version, the same for all workers of an iteration,
    # and never more than max_staleness (1) behind the learner.
    assert all(len(set(versions)) == 1 for versions in result.state.batch_versions)
    assert [versions[0] for versions in result.state.batch_versions] == [0, *range(ITERATIONS - 1)]
    assert [r["staleness"] for r in records] == [0] + [1] * (ITERATIONS - 1)
    assert result.state.dropped_batches == 0
    assert result.state.mean_return > 1.3 * result.state.first_mean_return
    assert result.state.env_steps == ITERATIONS * 16 * 128

    placement_file = json.loads((tmp_path / "placement.json").read_text())
    assert placement_file["relations"]["actor-rollout"] == "disaggregated"
    assert result.plot is not None and result.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "checkpoints/latest.json").exists()
    # TensorBoard event files hold every metric of every iteration, as metrics.jsonl does.
    board = read_tensorboard(tmp_path)
    assert board["learner_version"] == [(r["iteration"], r["learner_version"]) for r in records]
    # An env worker holds its rollout workers' handles (Ray loads their class there) yet never
    # imports torch: seconds of CPU per process saved at every launch.
    assert heavy_in_env_workers == [[], []]
    assert_resources_released()


def test_envs_that_do_not_split_over_the_env_workers_are_refused_before_any_worker_starts(
    cluster, tmp_path
) -> None:
    cfg = job_config("disaggregated", "algo.num_envs=15", f"run.output_dir={tmp_path}")
    with pytest.raises(JobConfigError, match=r"algo.num_envs: 15 cannot be split evenly over 2 env workers"):
        PPOJob.run(cfg, cluster=cluster)
    assert not ray.util.list_named_actors(all_namespaces=True)  # refused before any worker started
    assert json.loads((tmp_path / "summary.json").read_text())["outcome"] == "failed"
    assert_resources_released()
