"""The three strategies used directly (as RLinf users do): Flexible, Node and Packed."""

from __future__ import annotations

from typing import Any

import pytest

from rlinfra.placement import (
    ClusterSpec,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    Placement,
    PlacementError,
)
from rlinfra.placement.strategies import as_cluster_spec


def spec(accelerators: list[int], node_groups: list[dict[str, Any]] | None = None) -> ClusterSpec:
    cluster: dict[str, Any] = {"num_nodes": len(accelerators)}
    if node_groups is not None:
        cluster["node_groups"] = node_groups
    return ClusterSpec.from_config(cluster, accelerators)


def where(placements: list[Placement]) -> list[tuple[int, tuple[int, ...]]]:
    return [(p.cluster_node_rank, tuple(p.local_hardware_ranks)) for p in placements]


class TestFlexible:
    def test_processes_may_share_a_device(self) -> None:
        strategy = FlexiblePlacementStrategy([[0], [0], [1, 2], [9]])
        placements = strategy.get_placement(spec([8, 8]))
        assert strategy.world_size == 4
        assert where(placements) == [(0, (0,)), (0, (0,)), (0, (1, 2)), (1, (1,))]
        assert [p.visible_devices for p in placements] == ["0", "0", "1,2", "1"]
        assert [p.local_rank for p in placements] == [0, 1, 2, 0]
        assert [p.local_world_size for p in placements] == [3, 3, 3, 1]
        assert [p.world_size for p in placements] == [4] * 4

    def test_ranks_are_sorted_as_rlinf_documents(self) -> None:
        """Each process's ranks ascend, and processes are ordered by their first rank."""
        placements = FlexiblePlacementStrategy([[8], [0], [9]]).get_placement(spec([8, 8]))
        assert [p.hardware_ranks for p in placements] == [[0], [8], [9]]
        assert [p.placement_node_rank for p in placements] == [0, 1, 1]
        assert [p.local_rank for p in placements] == [0, 0, 1]
        (only,) = FlexiblePlacementStrategy([[2, 1, 3]]).get_placement(spec([8]))
        assert (only.hardware_ranks, only.visible_accelerators) == ([1, 2, 3], ["1", "2", "3"])
        first, _ = FlexiblePlacementStrategy([[4], [0]]).get_placement(spec([8]))
        assert (first.rank, first.local_hardware_ranks, first.local_accelerator_rank) == (0, [0], 0)

    def test_on_a_node_group(self) -> None:
        cluster = spec([8, 8, 8], [{"label": "late", "node_ranks": "1-2"}])
        placements = FlexiblePlacementStrategy([(0, 1), (8,)], node_group_label="late").get_placement(cluster)
        assert where(placements) == [(1, (0, 1)), (2, (0,))]
        assert {p.node_group_label for p in placements} == {"late"}

    def test_several_node_groups_as_a_list(self) -> None:
        cluster = spec([2, 2], [{"label": "a", "node_ranks": 0}, {"label": "b", "node_ranks": 1}])
        placements = FlexiblePlacementStrategy([[0], [2]], node_group_label=["b", "a"]).get_placement(cluster)
        assert where(placements) == [(1, (0,)), (0, (0,))]

    def test_isolation_off(self) -> None:
        placements = FlexiblePlacementStrategy([[3], [3]]).get_placement(spec([8]), isolate_accelerator=False)
        assert [(p.visible_devices, p.local_rank, p.local_hardware_ranks) for p in placements] == [
            (None, 0, [3]),
            (None, 1, [3]),
        ]
        # RLinf's fields: not isolated, a process sees every accelerator of its node.
        assert placements[0].visible_accelerators == [str(i) for i in range(8)]
        assert (placements[0].local_accelerator_rank, placements[0].isolate_accelerator) == (0, False)
        assert placements[0].visibility_env == {}

    def test_straddling_two_nodes_is_a_placement_error(self) -> None:
        strategy = FlexiblePlacementStrategy([[0], [7, 8]])
        with pytest.raises(PlacementError) as info:
            strategy.get_placement(spec([8, 8]))
        assert "process 1 would span nodes 0 and 1 (GPUs 7-8)" in info.value.problem
        assert info.value.where == "FlexiblePlacementStrategy"

    def test_missing_resource_is_a_placement_error(self) -> None:
        with pytest.raises(PlacementError, match="process 1 asks for GPU 16, which does not exist"):
            FlexiblePlacementStrategy([[0], [16]]).get_placement(spec([8, 8]))

    def test_unknown_node_group_is_a_placement_error(self) -> None:
        with pytest.raises(PlacementError, match="unknown node group 'gpu'") as info:
            FlexiblePlacementStrategy([[0]], node_group_label="gpu").get_placement(spec([8]))
        assert info.value.where == "FlexiblePlacementStrategy"

    @pytest.mark.parametrize(
        ("ranks_list", "problem"),
        [
            ([], "no processes"),
            (5, "no processes"),
            ("0-3", "no processes"),
            ([[]], "process 0 has resource ranks []"),
            ([[0], [-1]], "process 1 has resource ranks [-1]"),
            ([[True]], "process 0 has resource ranks [True]"),
            ([[0.0]], "process 0 has resource ranks [0.0]"),
            ([[0], 1], "process 1 has resource ranks 1"),
            ([["0"]], "process 0"),
            (["01"], "process 0 has resource ranks '01'"),
            ([[1, 1]], "process 0 lists a resource twice"),
        ],
    )
    def test_bad_input(self, ranks_list: Any, problem: str) -> None:
        with pytest.raises(PlacementError) as info:
            FlexiblePlacementStrategy(ranks_list)
        assert problem in info.value.problem

    @pytest.mark.parametrize("node_group", ["", "a,", [], 5.0, ["cluster", "cluster"]])
    def test_bad_node_group(self, node_group: Any) -> None:
        with pytest.raises(PlacementError, match="node group label"):
            FlexiblePlacementStrategy([[0]], node_group_label=node_group)

    def test_no_label_means_the_whole_cluster_as_in_rlinf(self) -> None:
        cluster = spec([2, 2], [{"label": "late", "node_ranks": 1}])
        assert FlexiblePlacementStrategy([[3]], node_group_label=None).node_groups == ("cluster",)
        assert NodePlacementStrategy([1], node_group_label=None).node_groups == ("node",)
        assert PackedPlacementStrategy(0, 3, node_group=None).node_groups == ("cluster",)
        assert where(FlexiblePlacementStrategy([[3]]).get_placement(cluster)) == [(1, (1,))]

    def test_numeric_node_group(self) -> None:
        cluster = spec([8, 4], [{"label": 4090, "node_ranks": 1}])
        placements = FlexiblePlacementStrategy([[3]], node_group_label=4090).get_placement(cluster)  # type: ignore[arg-type]
        assert where(placements) == [(1, (3,))]

    def test_results_are_cached_per_cluster_and_isolation_but_fresh_lists(self) -> None:
        cluster = spec([8])
        strategy = FlexiblePlacementStrategy([[0], [1]])
        first = strategy.get_placement(cluster)
        first.append(first[0])
        assert len(strategy.get_placement(cluster)) == 2
        assert strategy.get_placement(cluster, False)[0].visible_devices is None
        assert strategy.get_placement(spec([8]))[0].visible_devices == "0"

    def test_cluster_must_be_a_spec(self) -> None:
        with pytest.raises(PlacementError, match="expected a ClusterSpec or a Cluster, got dict"):
            FlexiblePlacementStrategy([[0]]).get_placement({"num_nodes": 1})

    def test_as_cluster_spec(self) -> None:
        cluster = spec([1])

        class Live:
            pass

        live = Live()
        live.spec = cluster  # type: ignore[attr-defined]
        assert as_cluster_spec(live) is cluster
        assert as_cluster_spec(cluster) is cluster
        with pytest.raises(PlacementError):
            as_cluster_spec(Live())


class TestNode:
    def test_default_node_group_is_every_node(self) -> None:
        strategy = NodePlacementStrategy([0, 0, 2, 1])
        placements = strategy.get_placement(spec([8, 8, 8]))
        assert [p.cluster_node_rank for p in placements] == [0, 0, 1, 2]  # sorted, as in RLinf
        assert [p.placement_node_rank for p in placements] == [0, 0, 1, 2]
        assert [p.local_rank for p in placements] == [0, 1, 0, 0]
        assert [p.local_world_size for p in placements] == [2, 2, 1, 1]
        assert {p.hardware_type for p in placements} == {"node"}
        assert [p.local_hardware_ranks for p in placements] == [[]] * 4
        assert {p.visible_devices for p in placements} == {None}
        first, _ = NodePlacementStrategy([1, 0]).get_placement(spec([8, 8]))
        assert (first.rank, first.cluster_node_rank) == (0, 0)
        assert strategy.world_size == 4

    def test_node_ranks_index_the_group(self) -> None:
        cluster = spec([8, 8, 8, 8], [{"label": "late", "node_ranks": "2-3"}])
        placements = NodePlacementStrategy([1, 0], node_group_label="late").get_placement(cluster)
        assert [p.cluster_node_rank for p in placements] == [2, 3]
        assert [p.hardware_ranks for p in placements] == [[0], [1]]

    def test_group_with_gpus_is_still_nodes(self) -> None:
        cluster = spec([8, 8], [{"label": "g", "node_ranks": "0-1"}])
        (placement,) = NodePlacementStrategy([1], node_group_label="g").get_placement(cluster)
        assert (placement.cluster_node_rank, placement.hardware_type) == (1, "node")

    def test_errors(self) -> None:
        with pytest.raises(PlacementError, match="process 1 asks for node 3, which does not exist"):
            NodePlacementStrategy([0, 3]).get_placement(spec([8, 8]))
        with pytest.raises(PlacementError, match="no processes"):
            NodePlacementStrategy([])
        with pytest.raises(PlacementError, match="process 0 has resource ranks"):
            NodePlacementStrategy([-1])
        with pytest.raises(PlacementError, match="node ranks 3"):
            NodePlacementStrategy(3)  # type: ignore[arg-type]


class TestPacked:
    def test_one_device_each(self) -> None:
        placements = PackedPlacementStrategy(0, 7).get_placement(spec([8]))
        assert [p.hardware_ranks for p in placements] == [[i] for i in range(8)]

    def test_chunks(self) -> None:
        placements = PackedPlacementStrategy(4, 11, num_hardware_per_process=2).get_placement(spec([8, 8]))
        assert where(placements) == [(0, (4, 5)), (0, (6, 7)), (1, (0, 1)), (1, (2, 3))]
        assert [p.visible_devices for p in placements] == ["4,5", "6,7", "0,1", "2,3"]

    def test_stride_interleaves_within_a_block(self) -> None:
        strategy = PackedPlacementStrategy(0, 7, num_hardware_per_process=2, stride=2)
        placements = strategy.get_placement(spec([8]))
        assert [p.hardware_ranks for p in placements] == [[0, 2], [1, 3], [4, 6], [5, 7]]
        assert strategy.world_size == 4

    def test_stride_one_device(self) -> None:
        placements = PackedPlacementStrategy(0, 3, stride=2).get_placement(spec([4]))
        assert [p.hardware_ranks for p in placements] == [[0], [1], [2], [3]]

    def test_straddling_chunk_is_a_placement_error_not_a_device_past_the_node(self) -> None:
        strategy = PackedPlacementStrategy(0, 11, num_hardware_per_process=3)
        with pytest.raises(PlacementError) as info:
            strategy.get_placement(spec([8, 8]))
        assert "process 2 would span nodes 0 and 1 (GPUs 6-8)" in info.value.problem
        assert info.value.where == "PackedPlacementStrategy"

    def test_straddling_on_uneven_nodes(self) -> None:
        with pytest.raises(PlacementError, match="span nodes 1 and 2"):
            PackedPlacementStrategy(8, 13, num_hardware_per_process=3).get_placement(spec([8, 4, 2]))
        placements = PackedPlacementStrategy(8, 13, num_hardware_per_process=2).get_placement(spec([8, 4, 2]))
        assert where(placements) == [(1, (0, 1)), (1, (2, 3)), (2, (0, 1))]

    def test_past_the_cluster(self) -> None:
        with pytest.raises(PlacementError, match="which does not exist"):
            PackedPlacementStrategy(0, 15).get_placement(spec([8]))

    def test_on_a_node_group(self) -> None:
        cluster = spec([8, 8], [{"label": "g", "node_ranks": 1}])
        placements = PackedPlacementStrategy(0, 3, 2, node_group="g").get_placement(cluster)
        assert where(placements) == [(1, (0, 1)), (1, (2, 3))]

    @pytest.mark.parametrize(
        ("args", "problem"),
        [
            ((-1, 3), "start_hardware_rank is -1"),
            ((0, -1), "end_hardware_rank is -1"),
            ((0, 3, 0), "num_hardware_per_process is 0"),
            ((0, 3, 1, 0), "stride is 0"),
            ((0, 3, True), "num_hardware_per_process is True"),
            ((0.0, 3), "start_hardware_rank is 0.0"),
            ((5, 3), "end_hardware_rank 3 < start_hardware_rank 5"),
            ((0, 6, 2), "7 devices do not split into blocks of 2 x stride 1"),
            ((0, 5, 2, 2), "6 devices do not split into blocks of 2 x stride 2"),
        ],
    )
    def test_bad_arguments(self, args: tuple, problem: str) -> None:
        with pytest.raises(PlacementError) as info:
            PackedPlacementStrategy(*args)
        assert problem in info.value.problem
        assert info.value.expected
