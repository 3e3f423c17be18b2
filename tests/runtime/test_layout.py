"""One placement group for a job, split among colocated and disaggregated components.

Simulated cluster: 2 nodes x 4 logical GPUs. `trainer` and `generator` share node 0's GPUs
(colocated), `inference` owns node 1's GPUs (disaggregated), `env` runs on whole nodes.
"""

from __future__ import annotations

import os

import pytest
import ray

from rlinfra import Worker
from rlinfra.runtime.errors import ClusterError
from rlinfra.runtime.layout import Layout

CFG = {
    "cluster": {
        "num_nodes": 2,
        "simulate": "2x4",
        "component_placement": {
            "trainer,generator": {"node_group": "train", "placement": "0-3"},
            "inference": {"node_group": "infer", "placement": "0-3"},
            "env": {"node_group": "node", "placement": "0-1:0-1"},
        },
        "node_groups": [{"label": "train", "node_ranks": 0}, {"label": "infer", "node_ranks": 1}],
    }
}
pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster(CFG)]
COMPONENTS = ["trainer", "generator", "inference", "env"]


class Probe(Worker):
    def where(self) -> tuple[str, str | None, list[str]]:
        return (
            ray.get_runtime_context().get_node_id(),
            os.environ.get("CUDA_VISIBLE_DEVICES"),
            [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])],
        )


def launch_job(cluster, placement):
    layout = Layout(cluster, placement, COMPONENTS, num_cpus=0.5)
    groups = {
        name: Probe.create_group().launch(
            cluster, placement.get_strategy(name), name=name, layout=layout, num_cpus=0.5
        )
        for name in COMPONENTS
    }
    return layout, groups


def shut(layout, groups):
    for group in groups.values():
        group.shutdown()
    layout.release()


def test_layout_table_is_derived_from_the_placement(cluster, placement):
    with Layout(cluster, placement, COMPONENTS, num_cpus=0.5) as layout:
        plan = layout.plan
        assert len(plan.bundles) == 10  # 8 devices + one CPU bundle per node for env
        assert plan.slices("trainer") == plan.slices("generator") == [(0, 4)]
        assert plan.slices("inference") == [(5, 4)]  # node 0's env bundle sits at index 4
        assert plan.relation("trainer", "generator") == "colocated"
        assert plan.relation("trainer", "inference") == "disaggregated"
        assert [r.num_gpus for r in plan.reservations["trainer"]] == [0.5] * 4
        assert [r.num_gpus for r in plan.reservations["inference"]] == [1.0] * 4
        # Ray's own table agrees on which node holds each bundle.
        by_ray = ray.util.placement_group_table(layout.pg)["bundles_to_node_id"]
        assert [by_ray[i] for i in range(10)] == [cluster.node(n).node_id for n in plan.bundle_nodes]


def test_colocated_and_disaggregated_groups_share_one_placement_group_and_keep_it_across_restarts(
    cluster, placement
):
    layout, groups = launch_job(cluster, placement)
    try:
        first = {name: groups[name].where().wait() for name in ("trainer", "inference")}
        generator = groups["generator"].where().wait()
        node0, node1 = cluster.node(0).node_id, cluster.node(1).node_id
        expected = [(node0, str(d), [str(d)]) for d in range(4)]
        assert first["trainer"] == expected  # Ray's ledger ids equal the placement's devices: no drift
        assert generator == expected
        assert first["inference"] == [(node1, str(d), [str(d)]) for d in range(4)]
        env_nodes = [node for node, _, _ in groups["env"].where().wait()]
        assert env_nodes == [node0, node1]

        # Ray's accounting: each shared GPU bundle is fully used by two 0.5 reservations.
        pg_hex = layout.pg.id.hex()
        available = ray.available_resources()
        for bundle in range(4):
            assert available.get(f"GPU_group_{bundle}_{pg_hex}", 0.0) == pytest.approx(0.0)
        assert available.get("GPU", 0.0) == pytest.approx(0.0)
    finally:
        shut(layout, groups)
    # Launched again (a new placement group): every rank lands where it was.
    layout, groups = launch_job(cluster, placement)
    try:
        assert {name: groups[name].where().wait() for name in ("trainer", "inference")} == first
    finally:
        shut(layout, groups)


def test_layout_refuses_components_it_was_not_planned_for(cluster, placement):
    with Layout(cluster, placement, ["trainer"], num_cpus=0.5) as layout:
        with pytest.raises(ClusterError, match="not in this layout"):
            Probe.create_group().launch(
                cluster, placement.get_strategy("inference"), name="inference", layout=layout
            )
        with pytest.raises(ClusterError, match="other placements"):
            Probe.create_group().launch(
                cluster,
                placement.get_strategy("trainer"),
                name="trainer",
                layout=layout,
                isolate_accelerator=False,
            )
    with pytest.raises(ClusterError, match="released"):
        Probe.create_group().launch(cluster, placement.get_strategy("trainer"), name="trainer", layout=layout)
