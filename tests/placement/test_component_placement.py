"""``ComponentPlacement`` end to end: every example of the seed, node groups, isolation, shapes."""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import pytest
import yaml
from omegaconf import OmegaConf

from rlinfra import ComponentPlacement as TopLevelComponentPlacement
from rlinfra.placement import (
    ClusterSpec,
    ComponentPlacement,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    Placement,
    PlacementError,
)


def plan(
    component_placement: dict[str, Any],
    accelerators: int | list[int] = 8,
    num_nodes: int | None = None,
    node_groups: list[dict[str, Any]] | None = None,
) -> ComponentPlacement:
    if num_nodes is None:
        num_nodes = len(accelerators) if isinstance(accelerators, list) else 1
    cluster: dict[str, Any] = {"num_nodes": num_nodes, "component_placement": component_placement}
    if node_groups is not None:
        cluster["node_groups"] = node_groups
    return ComponentPlacement({"cluster": cluster}, ClusterSpec.from_config(cluster, accelerators))


def where(placements: list[Placement]) -> list[tuple[int, tuple[int, ...]]]:
    """(cluster node, node-local devices) per rank — the map a user cares about."""
    return [(p.cluster_node_rank, tuple(p.local_hardware_ranks)) for p in placements]


SEED_HETEROGENEOUS = """
cluster:
  num_nodes: 6
  component_placement:
    actor:
      node_group: a800
      placement: 0-8
    rollout:
      node_group: 4090
      placement: 0-8
    env:
      node_group: robot
      placement: 0-3:0-7
    agent:
      node_group: node
      placement: 0-1:0-200,2-3:201-511
  node_groups:
    - label: a800
      node_ranks: 0-1
    - label: 4090
      node_ranks: 2-3
    - label: robot
      node_ranks: 4-5
      hardware:
        type: robot
        configs:
          - {node_rank: 4, robot_ip: 10.10.10.1}
          - {node_rank: 4, robot_ip: 10.10.10.2}
          - {node_rank: 5, robot_ip: 10.10.10.3}
          - {node_rank: 5, robot_ip: 10.10.10.4}
"""


class TestSeedExamples:
    def test_shorthand_shares_one_rule(self) -> None:
        text = "cluster:\n  num_nodes: 1\n  component_placement:\n    actor,inference: 0-7\n"
        cfg = OmegaConf.create(text)
        placement = ComponentPlacement(cfg, ClusterSpec.from_config(cfg.cluster))
        assert placement.components == ["actor", "inference"]
        assert placement.get_strategy("actor") is placement.get_strategy("inference")
        assert placement.config.components[0].placement == "0-7"
        for name in ("actor", "inference"):
            assert placement.get_world_size(name) == 8
            placements = placement.get_placements(name)
            assert [p.rank for p in placements] == list(range(8))
            assert [tuple(p.hardware_ranks) for p in placements] == [(i,) for i in range(8)]
            assert [p.visible_devices for p in placements] == [str(i) for i in range(8)]
            assert {p.node_group_label for p in placements} == {"cluster"}
            assert placement.get_strategy(name).node_groups == ("cluster",)

    @pytest.mark.parametrize("loader", [yaml.safe_load, OmegaConf.create])
    def test_heterogeneous_node_groups(self, loader: Any) -> None:
        cfg = loader(SEED_HETEROGENEOUS)
        spec = ClusterSpec.from_config(cfg["cluster"], [8, 8, 8, 8, 0, 0])
        placement = ComponentPlacement(cfg, spec)
        assert placement.components == ["actor", "rollout", "env", "agent"]

        for name, nodes, label in (("actor", (0, 1), "a800"), ("rollout", (2, 3), "4090")):
            placements = placement.get_placements(name)
            assert placement.get_world_size(name) == 9
            assert where(placements) == [(nodes[0], (i,)) for i in range(8)] + [(nodes[1], (0,))]
            assert [tuple(p.hardware_ranks) for p in placements] == [(i,) for i in range(9)]
            assert [p.placement_node_rank for p in placements] == [0] * 8 + [1]
            assert [p.local_world_size for p in placements] == [8] * 8 + [1]
            assert {p.hardware_type for p in placements} == {"GPU"}
            assert {p.node_group_label for p in placements} == {label}
        assert isinstance(placement.get_strategy("actor"), FlexiblePlacementStrategy)

        env = placement.get_placements("env")
        assert [tuple(p.hardware_ranks) for p in env] == [(0,), (0,), (1,), (1,), (2,), (2,), (3,), (3,)]
        assert where(env) == [(node, (unit,)) for node in (4, 5) for unit in (0, 0, 1, 1)]
        assert [p.local_rank for p in env] == [0, 1, 2, 3, 0, 1, 2, 3]
        assert {p.hardware_type for p in env} == {"robot"}
        assert {p.visible_devices for p in env} == {None}, "robots are not accelerators"

        agent = placement.get_placements("agent")
        assert isinstance(placement.get_strategy("agent"), NodePlacementStrategy)
        assert len(agent) == placement.get_world_size("agent") == 512
        assert Counter(p.cluster_node_rank for p in agent) == {0: 101, 1: 100, 2: 156, 3: 155}
        assert [p.cluster_node_rank for p in agent] == sorted(p.cluster_node_rank for p in agent)
        assert agent[200].cluster_node_rank == 1 and agent[201].cluster_node_rank == 2
        assert {p.hardware_type for p in agent} == {"node"}
        assert {tuple(p.local_hardware_ranks) for p in agent} == {()}
        assert {p.visible_devices for p in agent} == {None}
        assert [p.local_rank for p in agent if p.cluster_node_rank == 2] == list(range(156))
        assert {p.local_world_size for p in agent if p.cluster_node_rank == 3} == {155}

    def test_heterogeneous_labels(self) -> None:
        cfg = yaml.safe_load(SEED_HETEROGENEOUS)
        placement = ComponentPlacement(cfg, ClusterSpec.from_config(cfg["cluster"], [8, 8, 8, 8, 0, 0]))
        labels = {
            name: {p.node_group_label for p in placement.get_placements(name)}
            for name in placement.components
        }
        assert labels == {"actor": {"a800"}, "rollout": {"4090"}, "env": {"robot"}, "agent": {"node"}}
        assert placement.get_strategy("rollout").node_groups == ("4090",)

    def test_mixed_explicit_and_implicit_process_ranks(self) -> None:
        placement = plan({"actor": "0-1:0-3,3-5,7-10:7-14"}, [8, 8])
        placements = placement.get_placements("actor")
        assert placement.get_world_size("actor") == 15
        assert [tuple(p.hardware_ranks) for p in placements] == [
            (0,), (0,), (1,), (1,),          # processes 0-3 share GPUs 0-1
            (3,), (4,), (5,),                # processes 4-6, implicit, one per GPU
            (7,), (7,), (8,), (8,), (9,), (9,), (10,), (10,),  # processes 7-14 on GPUs 7-10
        ]  # fmt: skip
        assert where(placements)[6:9] == [(0, (5,)), (0, (7,)), (0, (7,))]
        assert where(placements)[9:] == [(1, (0,)), (1, (0,)), (1, (1,)), (1, (1,)), (1, (2,)), (1, (2,))]
        assert [p.local_rank for p in placements] == [*range(9), *range(6)]
        assert [p.local_world_size for p in placements] == [9] * 9 + [6] * 6

    def test_implicit_segments_continue_numbering(self) -> None:
        placements = plan({"actor": "0-3,4-7"}).get_placements("actor")
        assert [tuple(p.hardware_ranks) for p in placements] == [(i,) for i in range(8)]

    def test_single_node_group_conf_yaml(self) -> None:
        text = """
cluster:
  num_nodes: 1
  component_placement:
    test_worker:
      node_group: a800
      placement: 0-3
  node_groups:
    - label: a800
      node_ranks: 0
"""
        cfg = OmegaConf.create(text)
        placement = TopLevelComponentPlacement(cfg, ClusterSpec.from_config(cfg.cluster))
        placements = placement.get_strategy("test_worker").get_placement(placement.cluster_spec)
        assert where(placements) == [(0, (i,)) for i in range(4)]
        assert [p.visibility_env for p in placements] == [{"CUDA_VISIBLE_DEVICES": str(i)} for i in range(4)]

    def test_design_example(self) -> None:
        placement = plan(
            {
                "actor": "0-7",
                "rollout": {"node_group": "infer", "placement": "0-3:0-7"},
                "env": {"node_group": "node", "placement": "0-1:0-15"},
            },
            [8, 8],
            node_groups=[{"label": "infer", "node_ranks": 1}],
        )
        assert where(placement.get_placements("rollout")) == [(1, (i // 2,)) for i in range(8)]
        assert Counter(p.cluster_node_rank for p in placement.get_placements("env")) == {0: 8, 1: 8}


class TestResourceKinds:
    def test_cpu_only_cluster_places_on_nodes(self) -> None:
        placement = plan({"actor": "0-1:0-4", "critic": "all"}, [0, 0])
        actor = placement.get_placements("actor")
        assert [p.cluster_node_rank for p in actor] == [0, 0, 0, 1, 1]
        assert {p.hardware_type for p in actor} == {"node"}
        assert {p.visible_devices for p in actor} == {None}
        assert isinstance(placement.get_strategy("actor"), NodePlacementStrategy)
        assert [p.cluster_node_rank for p in placement.get_placements("critic")] == [0, 1]

    def test_group_without_accelerators_is_nodes_even_on_a_gpu_cluster(self) -> None:
        placement = plan(
            {"env": {"node_group": "cpu", "placement": "0-1:0-3"}},
            [8, 0, 0],
            node_groups=[{"label": "cpu", "node_ranks": "1-2"}],
        )
        assert where(placement.get_placements("env")) == [(1, ()), (1, ()), (2, ()), (2, ())]

    def test_ignore_hardware_makes_resources_nodes(self) -> None:
        placement = plan(
            {"gpu": {"node_group": "plain", "placement": "0-1:0-2"}},
            [8, 8],
            node_groups=[{"label": "plain", "node_ranks": "0-1", "ignore_hardware": True}],
        )
        assert [p.cluster_node_rank for p in placement.get_placements("gpu")] == [0, 0, 1]
        assert {p.hardware_type for p in placement.get_placements("gpu")} == {"node"}
        robots = {"type": "robot", "configs": [{"node_rank": 0, "ip": "a"}]}
        with pytest.raises(PlacementError, match="ignore_hardware: true cannot declare hardware"):
            plan(
                {"robot": {"node_group": "robots", "placement": "0"}},
                [8, 8],
                node_groups=[
                    {"label": "robots", "node_ranks": "0-1", "hardware": robots, "ignore_hardware": True}
                ],
            )

    def test_declared_hardware_wins_over_accelerators(self) -> None:
        hardware = {"type": "camera", "configs": [{"node_rank": 0, "serial": f"c{i}"} for i in range(3)]}
        placement = plan(
            {"cam": {"node_group": "cams", "placement": "all"}},
            [8],
            node_groups=[{"label": "cams", "node_ranks": 0, "hardware": hardware}],
        )
        cams = placement.get_placements("cam")
        assert [(p.hardware_type, tuple(p.local_hardware_ranks)) for p in cams] == [
            ("camera", (0,)),
            ("camera", (1,)),
            ("camera", (2,)),
        ]
        assert {p.visible_devices for p in cams} == {None}

    def test_custom_hardware_can_be_owned_in_groups_on_one_node(self) -> None:
        hardware = {
            "type": "robot",
            "configs": [{"node_rank": i // 2, "ip": f"10.0.0.{i}"} for i in range(4)],
        }
        groups = [{"label": "r", "node_ranks": "0-1", "hardware": hardware}]
        placements = plan({"env": {"node_group": "r", "placement": "all:0-1"}}, [0, 0], node_groups=groups)
        assert where(placements.get_placements("env")) == [(0, (0, 1)), (1, (0, 1))]
        with pytest.raises(PlacementError, match="span nodes 0 and 1"):
            plan({"env": {"node_group": "r", "placement": "1-2:0"}}, [0, 0], node_groups=groups)

    def test_reserved_node_group_on_a_gpu_cluster(self) -> None:
        placements = plan({"a": {"node_group": "node", "placement": "all"}}, [8, 8]).get_placements("a")
        assert [(p.cluster_node_rank, p.hardware_type) for p in placements] == [(0, "node"), (1, "node")]

    def test_npu_visibility(self) -> None:
        cluster = {"num_nodes": 1, "component_placement": {"a": "0-3:0-1"}}
        spec = ClusterSpec.from_config(cluster, 4, accelerator_type="NPU")
        placements = ComponentPlacement({"cluster": cluster}, spec).get_placements("a")
        assert [p.visibility_env for p in placements] == [
            {"ASCEND_RT_VISIBLE_DEVICES": "0,1"},
            {"ASCEND_RT_VISIBLE_DEVICES": "2,3"},
        ]


class TestShapes:
    def test_uneven_nodes(self) -> None:
        placement = plan({"all": "all", "mid": "8-11", "pairs": "0-13:0-6"}, [8, 4, 2])
        every = placement.get_placements("all")
        assert len(every) == 14
        assert where(every) == [(0, (i,)) for i in range(8)] + [(1, (i,)) for i in range(4)] + [
            (2, (0,)),
            (2, (1,)),
        ]
        assert [p.local_world_size for p in every] == [8] * 8 + [4] * 4 + [2] * 2
        assert [p.placement_node_rank for p in every] == [0] * 8 + [1] * 4 + [2] * 2
        assert where(placement.get_placements("mid")) == [(1, (i,)) for i in range(4)]
        assert placement.get_placements("mid")[0].placement_node_rank == 0
        pairs = placement.get_placements("pairs")
        assert [tuple(p.hardware_ranks) for p in pairs] == [(2 * i, 2 * i + 1) for i in range(7)]
        assert [p.visible_devices for p in pairs] == ["0,1", "2,3", "4,5", "6,7", "0,1", "2,3", "0,1"]

    def test_uneven_nodes_reject_a_group_that_straddles(self) -> None:
        with pytest.raises(PlacementError, match=r"process 2 would span nodes 0 and 1 \(GPUs 6-8\)"):
            plan({"a": "0-11:0-3"}, [8, 4, 2])

    def test_multi_device_processes(self) -> None:
        placements = plan({"a": "0-15:0-1"}, [8, 8]).get_placements("a")
        assert where(placements) == [(0, tuple(range(8))), (1, tuple(range(8)))]
        assert placements[1].visible_devices == "0,1,2,3,4,5,6,7"

    def test_sparse_resources_and_gaps(self) -> None:
        placements = plan({"a": "1,5-6,15"}, [8, 8]).get_placements("a")
        assert [tuple(p.hardware_ranks) for p in placements] == [(1,), (5,), (6,), (15,)]
        assert where(placements) == [(0, (1,)), (0, (5,)), (0, (6,)), (1, (7,))]

    def test_int_placement_from_yaml(self) -> None:
        cfg = yaml.safe_load("cluster:\n  num_nodes: 1\n  component_placement:\n    a: 3\n")
        placement = ComponentPlacement(cfg, ClusterSpec.from_config(cfg["cluster"]))
        assert placement.config.components[0].placement == "3"
        assert [tuple(p.hardware_ranks) for p in placement.get_placements("a")] == [(3,)]

    def test_nodes_spread_evenly_first_nodes_get_the_extra(self) -> None:
        placements = plan({"a": {"node_group": "node", "placement": "0-2:0-7"}}, [0, 0, 0]).get_placements(
            "a"
        )
        assert [p.cluster_node_rank for p in placements] == [0, 0, 0, 1, 1, 1, 2, 2]
        assert [p.local_rank for p in placements] == [0, 1, 2, 0, 1, 2, 0, 1]
        assert [p.local_world_size for p in placements] == [3] * 6 + [2] * 2


class TestNodeGroupSelection:
    GROUPS: ClassVar[list[dict[str, Any]]] = [
        {"label": "b", "node_ranks": "2-3"},
        {"label": "a", "node_ranks": [1, 0]},
    ]

    def test_groups_concatenate_in_the_listed_order(self) -> None:
        placement = plan(
            {"x": {"node_group": "b,a", "placement": "all"}, "y": {"node_group": "a, b", "placement": "all"}},
            [8, 8, 8, 8],
            node_groups=self.GROUPS,
        )
        x = placement.get_placements("x")
        assert [p.cluster_node_rank for p in x] == [2] * 8 + [3] * 8 + [0] * 8 + [1] * 8
        assert [p.placement_node_rank for p in x] == [0] * 8 + [1] * 8 + [2] * 8 + [3] * 8
        assert [p.node_group_label for p in x] == ["b"] * 16 + ["a"] * 16
        assert [tuple(p.hardware_ranks) for p in x] == [(i,) for i in range(32)]
        y = placement.get_placements("y")
        assert [p.cluster_node_rank for p in y] == [0] * 8 + [1] * 8 + [2] * 8 + [3] * 8
        assert placement.get_strategy("x").node_groups == ("b", "a")

    def test_resource_numbering_crosses_the_group_boundary(self) -> None:
        placement = plan(
            {"x": {"node_group": "b,a", "placement": "15-16"}}, [8, 8, 8, 8], node_groups=self.GROUPS
        )
        assert where(placement.get_placements("x")) == [(3, (7,)), (0, (0,))]
        with pytest.raises(PlacementError, match="span nodes 3 and 0"):
            plan({"x": {"node_group": "b,a", "placement": "14-17:0"}}, [8, 8, 8, 8], node_groups=self.GROUPS)

    @pytest.mark.parametrize("loader", [yaml.safe_load, OmegaConf.create])
    def test_yaml_list_node_group(self, loader: Any) -> None:
        text = """
cluster:
  num_nodes: 4
  component_placement:
    x:
      node_group: [b, a]
      placement: 0-3:0-1
    y:
      node_group:
        - 4090
      placement: all
  node_groups:
    - label: b
      node_ranks: [3, 2]
    - label: a
      node_ranks: 0-1
    - label: 4090
      node_ranks:
        - 0
"""
        cfg = loader(text)
        placement = ComponentPlacement(cfg, ClusterSpec.from_config(cfg["cluster"], 2))
        assert where(placement.get_placements("x")) == [(2, (0, 1)), (3, (0, 1))]
        assert placement.get_strategy("x").node_groups == ("b", "a")
        assert where(placement.get_placements("y")) == [(0, (0,)), (0, (1,))]

    def test_numeric_node_group_scalar(self) -> None:
        cfg = yaml.safe_load(
            "cluster:\n  num_nodes: 2\n  component_placement:\n    r:\n      node_group: 4090\n"
            "      placement: all\n  node_groups:\n    - label: 4090\n      node_ranks: 1\n"
        )
        placement = ComponentPlacement(cfg, ClusterSpec.from_config(cfg["cluster"], [8, 4]))
        assert {p.cluster_node_rank for p in placement.get_placements("r")} == {1}
        assert placement.get_world_size("r") == 4

    def test_cpu_groups_concatenate_as_nodes(self) -> None:
        placement = plan(
            {"x": {"node_group": ["b", "a"], "placement": "all"}}, [0, 0, 0, 0], node_groups=self.GROUPS
        )
        assert [p.cluster_node_rank for p in placement.get_placements("x")] == [2, 3, 0, 1]


class TestIsolation:
    def test_isolation_off_keeps_true_local_ranks(self) -> None:
        placement = plan({"a": "0-15:0-7"}, [8, 8])
        strategy = placement.get_strategy("a")
        isolated = strategy.get_placement(placement.cluster_spec)
        shared = strategy.get_placement(placement.cluster_spec, isolate_accelerator=False)
        assert [p.visible_devices for p in isolated] == ["0,1", "2,3", "4,5", "6,7"] * 2
        assert {p.visible_devices for p in shared} == {None}
        assert [p.visibility_env for p in shared] == [{}] * 8
        assert [p.local_rank for p in shared] == [0, 1, 2, 3, 0, 1, 2, 3]
        assert [tuple(p.local_hardware_ranks) for p in shared] == [
            tuple(p.local_hardware_ranks) for p in isolated
        ]
        everything = [str(i) for i in range(8)]
        unisolated = [
            p._replace(isolate_accelerator=False, visible_accelerators=everything, local_accelerator_rank=0)
            for p in isolated
        ]
        assert unisolated == shared

    def test_get_placements_shortcut_and_fresh_lists(self) -> None:
        placement = plan({"a": "0-3"})
        first = placement.get_placements("a")
        first.clear()
        assert len(placement.get_placements("a")) == 4
        assert placement.get_placements("a", isolate_accelerator=False)[0].visible_devices is None
        assert placement.get_placements("a")[0].visible_devices == "0"

    def test_placement_records(self) -> None:
        (record,) = plan({"a": "9"}, [8, 8]).get_placements("a")
        assert record.to_dict() == {
            "rank": 0,
            "world_size": 1,
            "cluster_node_rank": 1,
            "placement_node_rank": 0,
            "local_rank": 0,
            "local_world_size": 1,
            "accelerator_type": "GPU",
            "local_accelerator_rank": 1,
            "visible_accelerators": ["1"],
            "isolate_accelerator": True,
            "hardware_type": "GPU",
            "hardware_ranks": [9],
            "local_hardware_ranks": [1],
            "node_group_label": "cluster",
            "visible_devices": "1",
        }


class TestApi:
    def test_components_keep_config_order(self) -> None:
        placement = plan({"z": "0", "a,m": "1", "b": "2"})
        assert placement.components == ["z", "a", "m", "b"]
        assert placement.get_strategy("a") is placement.get_strategy("m")
        assert placement.get_strategy("z") is not placement.get_strategy("b")

    def test_component_names_are_stripped(self) -> None:
        placement = plan({" actor , inference ": "0-1"})
        assert placement.components == ["actor", "inference"]

    def test_unknown_component(self) -> None:
        placement = plan({"actor": "0"})
        for call in (placement.get_strategy, placement.get_world_size, placement.get_placements):
            with pytest.raises(PlacementError, match="unknown component 'critic'") as info:
                call("critic")
            assert "'actor'" in info.value.expected

    def test_accepts_an_object_with_a_spec(self) -> None:
        class LiveCluster:
            def __init__(self, spec: ClusterSpec) -> None:
                self.spec = spec

        cluster = {"num_nodes": 1, "component_placement": {"a": "0-1"}}
        placement = ComponentPlacement({"cluster": cluster}, LiveCluster(ClusterSpec.from_config(cluster)))
        assert placement.get_world_size("a") == 2

    def test_accepts_attribute_style_config(self) -> None:
        class Cfg:
            cluster = OmegaConf.create({"num_nodes": 1, "component_placement": {"a": "0-1"}})

        placement = ComponentPlacement(Cfg(), ClusterSpec.from_config(Cfg.cluster))
        assert placement.get_world_size("a") == 2

    def test_interpolations_resolve(self) -> None:
        cfg = OmegaConf.create(
            {
                "gpus": "0-3",
                "nodes": 2,
                "cluster": {"num_nodes": "${nodes}", "component_placement": {"a": "${gpus}"}},
            }
        )
        placement = ComponentPlacement(cfg, ClusterSpec.from_config(cfg.cluster))
        assert placement.cluster_spec.num_nodes == 2
        assert placement.config.components[0].placement == "0-3"
        assert placement.get_world_size("a") == 4

    def test_same_config_same_plan(self) -> None:
        cfg = yaml.safe_load(SEED_HETEROGENEOUS)
        first = ComponentPlacement(cfg, ClusterSpec.from_config(cfg["cluster"], [8, 8, 8, 8, 0, 0]))
        second = ComponentPlacement(cfg, ClusterSpec.from_config(cfg["cluster"], [8, 8, 8, 8, 0, 0]))
        for name in first.components:
            assert first.get_placements(name) == second.get_placements(name)
