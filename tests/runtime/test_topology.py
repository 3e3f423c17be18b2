"""Topology constraints: custom resources, node labels, allowed nodes, and the bundle → node report.

One simulated cluster for the module: 2 nodes x 2 logical GPUs; node 0 has two units of the custom
resource ``nvlink_domain_0`` and label ``zone=a``, node 1 has neither resource and ``zone=b``.
"""

from __future__ import annotations

import time

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

from rlinfra import Cluster, ComponentPlacement, Worker
from rlinfra.placement import ClusterSpec, PlacementError
from rlinfra.placement.constraints import Constraints
from rlinfra.runtime.layout import Layout, ReservationError
from rlinfra.runtime.topology import TopologyError

pytestmark = pytest.mark.timeout(180)

CLUSTER = {
    "num_nodes": 2,
    "simulate": "2x2",
    "simulate_cpus": 4,
    "simulate_resources": [{"nvlink_domain_0": 2}, {}],
    "simulate_labels": [{"zone": "a"}, {"zone": "b"}],
    "node_groups": [
        {"label": "nvl", "node_ranks": 0, "constraints": {"resources": {"nvlink_domain_0": 1}}},
        {"label": "east", "node_ranks": 1, "constraints": {"labels": {"zone": "b"}}},
    ],
    "component_placement": {
        "trainer": {"node_group": "nvl", "placement": "0-1"},
        "sampler": {"node_group": "east", "placement": "0-1"},
        "misplaced": {"placement": "2-3", "constraints": {"resources": {"nvlink_domain_0": 1}}},
        "unknown": {"placement": "0", "constraints": {"resources": {"nvlink_domain_7": 1}}},
        "wrong_zone": {"placement": "2", "constraints": {"labels": {"zone": "a"}}},
        "waiter": {
            "node_group": "node",
            "placement": "0:0",
            "constraints": {"resources": {"nvlink_domain_0": 1}},
        },
    },
}
CFG = {"cluster": CLUSTER}


class Where(Worker):
    def where(self) -> tuple[str, dict[str, float]]:
        context = ray.get_runtime_context()
        return context.get_node_id(), dict(context.get_assigned_resources())


@pytest.fixture(scope="module")
def cluster():
    with Cluster(cluster_cfg=CLUSTER) as live:
        yield live


@pytest.fixture(scope="module")
def placement(cluster):
    return ComponentPlacement(CFG, cluster)


def test_custom_resource_constraint_is_reserved_and_reported(cluster, placement) -> None:
    with Layout(cluster, placement, ["trainer"], num_cpus=0.5) as layout:
        assert layout.plan.bundles[0]["nvlink_domain_0"] == 1.0
        group = Where.create_group().launch(
            cluster, placement.get_strategy("trainer"), name="trainer", layout=layout, num_cpus=0.5
        )
        try:
            seen = group.where().wait()
            report = group.bundle_report()
            assert [row.rank for row in report] == [0, 1]
            for row, record, (node_id, resources) in zip(report, group.placements, seen, strict=True):
                assert row.matches and row.node_rank == record.cluster_node_rank == 0
                assert row.node_id == node_id == cluster.node(0).node_id  # Ray's table = where it runs
                assert resources.get("nvlink_domain_0") == 1.0
            assert layout.bundle_report("trainer") == report
        finally:
            group.shutdown()


def test_label_constraint_is_met_on_the_labelled_node(cluster, placement) -> None:
    group = Where.create_group().launch(
        cluster, placement.get_strategy("sampler"), name="sampler", num_cpus=0.5
    )
    try:
        assert {node_id for node_id, _ in group.where().wait()} == {cluster.node(1).node_id}
        assert all(row.matches and row.node_rank == 1 for row in group.bundle_report())
    finally:
        group.shutdown()


@pytest.mark.parametrize(
    ("component", "fragments"),
    [
        (
            "misplaced",
            [
                "'misplaced' requires resource nvlink_domain_0=1 per process",
                "node 1 has 0, needs 2",
                "nodes with nvlink_domain_0: 0",
            ],
        ),
        ("unknown", ["nvlink_domain_7=1", "node 0 has 0, needs 1", "nodes with nvlink_domain_7: (none)"]),
        ("wrong_zone", ["requires node label zone=a", "node 1 has zone=b", "nodes with zone=a: 0"]),
    ],
)
def test_unsatisfiable_constraints_fail_fast_naming_the_nodes(
    cluster, placement, component, fragments
) -> None:
    started = time.monotonic()
    with pytest.raises(TopologyError) as caught:
        Where.create_group().launch(
            cluster, placement.get_strategy(component), name=component, launch_timeout=60
        )
    assert time.monotonic() - started < 5  # not the 60 s deadline: Ray would wait forever
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_feasible_but_busy_times_out_naming_the_constraint(cluster, placement) -> None:
    holder = placement_group(
        [{"nvlink_domain_0": 2}], bundle_label_selector=[{"ray.io/node-id": cluster.node(0).node_id}]
    )
    ray.get(holder.ready(), timeout=30)
    try:
        started = time.monotonic()
        with pytest.raises(ReservationError) as caught:
            Where.create_group().launch(
                cluster, placement.get_strategy("waiter"), name="waiter", launch_timeout=2, num_cpus=0.5
            )
        assert time.monotonic() - started < 10
        message = str(caught.value)
        assert "nvlink_domain_0=1 requested, 0 free (short by 1)" in message
        assert "topology constraints in force" in message and "resources nvlink_domain_0=1" in message
    finally:
        remove_placement_group(holder)


# --- parse time (no cluster) -------------------------------------------------------------------------


def spec_cfg(component: dict, groups: list | None = None) -> dict:
    return {"cluster": {"num_nodes": 2, "component_placement": {"c": component}, "node_groups": groups or []}}


def resolve(cfg: dict) -> ComponentPlacement:
    return ComponentPlacement(cfg, ClusterSpec.from_config(cfg["cluster"], 2))


def test_nodes_constraint_is_checked_against_the_placement() -> None:
    assert resolve(spec_cfg({"placement": "0-1", "constraints": {"nodes": 0}})).get_world_size("c") == 2
    with pytest.raises(PlacementError) as caught:
        resolve(spec_cfg({"placement": "1-3", "constraints": {"nodes": [0]}}))
    message = str(caught.value)
    assert "cluster.component_placement.c.constraints.nodes" in message
    assert "rank 1 is placed on node 1, outside constraints.nodes 0" in message


def test_group_and_component_constraints_merge_per_process() -> None:
    groups = [
        {"label": "g", "node_ranks": 1, "constraints": {"resources": {"a": 1}, "labels": {"zone": "b"}}}
    ]
    cfg = spec_cfg(
        {"node_group": "g", "placement": "0", "constraints": {"resources": {"a": 0.5, "b": 2}}}, groups
    )
    (merged,) = resolve(cfg).get_process_constraints("c")
    assert merged == Constraints(None, (("a", 0.5), ("b", 2.0)), (("zone", "b"),))
    conflict = spec_cfg(
        {"node_group": "g", "placement": "0", "constraints": {"labels": {"zone": "a"}}}, groups
    )
    with pytest.raises(PlacementError, match="'zone' must be 'b' \\(node group\\) and 'a' \\(component\\)"):
        resolve(conflict)


@pytest.mark.parametrize(
    ("constraints", "fragment"),
    [
        ({"resources": {"GPU": 1}}, "one of Ray's own resources"),
        ({"resources": {"x": 1.5}}, "a fraction up to 1, or a whole number"),
        ({"resources": {"x": True}}, "resource 'x' amount True"),
        ({"labels": {"zone": "!a"}}, "an exact value"),
        ({"labels": {"ray.io/node-id": "abc"}}, "constraints.nodes to pin nodes"),
        ({"nodes": 5}, "node rank 5 does not exist"),
        ({"node": 0}, "unknown key 'node'"),
    ],
)
def test_bad_constraints_are_placement_errors(constraints: dict, fragment: str) -> None:
    with pytest.raises(PlacementError) as caught:
        resolve(spec_cfg({"placement": "0", "constraints": constraints}))
    assert fragment in str(caught.value)


def test_node_groups_pin_nodes_with_node_ranks_not_constraints() -> None:
    groups = [{"label": "g", "node_ranks": 1, "constraints": {"nodes": 1}}]
    with pytest.raises(PlacementError, match="unknown key 'nodes'"):
        resolve(spec_cfg({"node_group": "g", "placement": "0"}, groups))
