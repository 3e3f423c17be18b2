"""A node lost mid-run: its rollout worker cannot be replaced (its bundle and devices are gone), so
the job goes on with the other rollout worker; the env worker and the trainer live elsewhere."""

from __future__ import annotations

import pytest

from examples.ppo_cartpole import reporting
from examples.ppo_cartpole.job import run
from tests.examples.job_checks import job_config

pytestmark = pytest.mark.timeout(300)

OVERRIDES = (
    "cluster.num_nodes=3",
    "cluster.simulate=3x2",
    "cluster.component_placement.actor.placement=0-1",  # node 0
    "cluster.component_placement.rollout.placement='2,4'",  # one on node 1, one on node 2
    "cluster.component_placement.env.placement=0",  # node 0
)
CFG = job_config("disaggregated", *OVERRIDES)


def test_a_lost_node_leaves_its_rollout_worker_out_and_the_run_goes_on(cluster, tmp_path) -> None:
    def lose_node_two(record: dict) -> None:
        if record["iteration"] == 2:
            node_two = cluster.nodes[2].node_id
            cluster.embedded.kill_node(
                next(n for n in cluster.embedded.simulated_nodes if n.node_id == node_two)
            )

    cfg = job_config("disaggregated", *OVERRIDES, "algo.iterations=5", f"run.output_dir={tmp_path}")
    result = run(cfg, cluster=cluster, on_iteration=lose_node_two)

    assert result.iterations == 5 and not result.interrupted
    (recovery,) = result.state.recoveries
    assert recovery.dropped == [("rollout", 1)]
    assert [(r.component, r.rank, r.node_rank, r.outcome) for r in recovery.restarts] == []
    records = reporting.read_metrics(tmp_path)
    assert [r["rollout_workers"] for r in records][-2:] == [1, 1]
    assert all(len(set(versions)) == 1 for versions in result.batch_versions)
    assert result.batches["duplicated"] == 0 and result.batches["open"] == 0
