"""Every rule's error: a ``PlacementError`` at construction that names the component, quotes the
string with a caret under the offending characters, and says what was expected."""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf

import rlinfra
from rlinfra.config import ConfigError
from rlinfra.placement import ClusterSpec, ComponentPlacement, NodeSpec, PlacementError, parse_cluster_config
from rlinfra.placement.errors import Span, short_ranks
from rlinfra.placement.mapping import MAX_PROCESSES

PREFIX = len("  in: ")

ROBOTS = {
    "label": "robot",
    "node_ranks": "2-3",
    "hardware": {
        "type": "robot",
        "configs": [{"node_rank": 2, "ip": "a"}, {"node_rank": 2, "ip": "b"}, {"node_rank": 3, "ip": "c"}],
    },
}
GROUPS = [{"label": "a800", "node_ranks": "0-1"}, {"label": "cpu", "node_ranks": 4}, ROBOTS]


def fail(component_placement: Any, accelerators: int | list[int] = 8, num_nodes: int = 2) -> PlacementError:
    """The error of placing ``component_placement`` on a 2x8 cluster (or as given)."""
    if isinstance(accelerators, list):
        num_nodes = len(accelerators)
    node_groups = GROUPS if num_nodes >= 5 else []
    cluster = {"num_nodes": num_nodes, "component_placement": component_placement, "node_groups": node_groups}
    with pytest.raises(PlacementError) as info:
        ComponentPlacement({"cluster": cluster}, ClusterSpec.from_config(cluster, accelerators))
    assert isinstance(info.value, ValueError)
    return info.value


def caret(error: PlacementError) -> tuple[int, int]:
    """(column inside the user's text, width) of the caret line."""
    lines = [line for line in str(error).splitlines() if line.strip() and set(line.strip()) == {"^"}]
    assert len(lines) == 1, str(error)
    start = len(lines[0]) - len(lines[0].lstrip())
    return start - PREFIX, len(lines[0].strip())


def test_full_message_for_the_renumbering_trap() -> None:
    """RLinf silently renumbers ``0-3:4-7``; we refuse it and say why."""
    error = fail({"actor": "0-3:4-7"})
    assert str(error) == (
        "component 'actor': process ranks must be 0..N-1 in order; this segment skips ranks (starts at 4)\n"
        "  in: 0-3:4-7\n"
        "          ^^^\n"
        "  expected: process ranks starting at 0"
    )
    assert (error.where, error.text, error.span) == ("component 'actor'", "0-3:4-7", Span(4, 7))
    assert error.expected == "process ranks starting at 0"


@pytest.mark.parametrize(
    ("placement", "problem", "column", "width", "expected"),
    [
        # resource ranks exist
        ("0-16", "GPU rank 16 does not exist: node group 'cluster' has 16 GPUs on nodes 0-1", 0, 4, "0-15"),
        ("0-3,15-20:4-9", "GPU rank 20 does not exist", 4, 5, "GPU ranks within 0-15, or 'all'"),
        # resource ranks ascend without repeats
        ("0-3,2", "must ascend without repeats, but 2 follows 3", 4, 1, "GPU ranks from 4 on"),
        ("4-7,0-3", "but 0 follows 7", 4, 3, "GPU ranks from 8 on"),
        ("0-3, 3 ", "but 3 follows 3", 5, 1, "from 4 on"),
        ("0-3,all", "but 0 follows 3", 4, 3, "from 4 on"),
        ("all,0", "but 0 follows 15", 4, 1, "from 16 on"),
        # process ranks are exactly 0..N-1 in order
        ("0-3:1-4", "skips ranks (starts at 1)", 4, 3, "process ranks starting at 0"),
        ("0-1:0-3,2-3:2-5", "repeats ranks (starts at 2)", 12, 3, "process ranks starting at 4"),
        ("0-1,2-3:0-1", "repeats ranks (starts at 0)", 8, 3, "process ranks starting at 2"),
        ("0-1:0-3,2-3:5-6", "skips ranks (starts at 5)", 12, 3, "process ranks starting at 4"),
        # integer-multiple rule on devices
        ("0-2:0-1", "3 GPUs cannot be split evenly among 2 processes", 0, 7, "multiple or a divisor of 3"),
        ("0-1:0-2", "3 processes cannot share 2 GPUs evenly", 0, 7, "multiple or a divisor of 2"),
        ("0-3, 4-9:4-7 ", "6 GPUs cannot be split evenly among 4 processes", 5, 7, "divisor of 6"),
        # a multi-device process lies on one node
        ("6-9:0", "process 0 would span nodes 0 and 1 (GPUs 6-9)", 0, 3, "groups of 4 GPUs"),
        (
            "0-1,6-13:2-3",
            "process 2 would span nodes 0 and 1 (GPUs 6-9)",
            4,
            4,
            "groups of 4 GPUs that each lie on one node",
        ),
        ("0-11:0-3", "process 2 would span nodes 0 and 1 (GPUs 6-8)", 0, 4, "groups of 3 GPUs"),
        # grammar, seen through ComponentPlacement
        ("0-3:all", "'all' is only allowed for resource ranks", 4, 3, "process ranks as a number"),
        ("0-3,,4", "empty segment", 4, 1, "a segment 'resources[:processes]'"),
        ("0-x", "cannot read resource ranks '0-x'", 0, 3, "'all', a non-negative integer"),
        ("3-0", "runs backwards", 0, 3, "did you mean '0-3'?"),
    ],
)
def test_placement_string_rules(placement: str, problem: str, column: int, width: int, expected: str) -> None:
    error = fail({"actor": placement})
    assert problem in error.problem
    assert error.where == "component 'actor'"
    assert error.text == placement
    assert caret(error) == (column, width)
    assert expected in error.expected
    lines = str(error).splitlines()
    assert lines[0] == f"component 'actor': {error.problem}"
    assert lines[1] == f"  in: {placement}"
    assert lines[-1] == f"  expected: {error.expected}"


def test_too_many_processes() -> None:
    error = fail({"actor": f"0-1:0-{MAX_PROCESSES}"})
    assert "more than 1,000,000 processes" in error.problem
    assert caret(error) == (0, len(f"0-1:0-{MAX_PROCESSES}"))


def test_nodes_need_at_least_one_process_each() -> None:
    error = fail({"agent": {"node_group": "node", "placement": "0-1:0-200,2-4:201-202"}}, [8, 8, 8, 8, 0])
    assert error.problem == "3 nodes for 2 process(es): a process runs on one node"
    assert caret(error) == (10, 11)
    assert error.expected == "at least 3 processes, or fewer nodes"


def test_node_rank_past_the_group() -> None:
    error = fail({"agent": {"node_group": "node", "placement": "0-5"}}, [8, 8, 8, 8, 0])
    assert error.problem == "node rank 5 does not exist: node group 'node' has 5 nodes on nodes 0-4"
    assert caret(error) == (0, 3)


def test_custom_hardware_rank_past_the_group() -> None:
    error = fail({"env": {"node_group": "robot", "placement": "0-3:0-7"}}, [8, 8, 0, 0, 0])
    assert error.problem == "robot rank 3 does not exist: node group 'robot' has 3 robots on nodes 2-3"
    assert error.expected == "robot ranks within 0-2, or 'all'"


def test_custom_hardware_obeys_the_multiple_rule() -> None:
    error = fail({"env": {"node_group": "robot", "placement": "all:0-1"}}, [8, 8, 0, 0, 0])
    assert error.problem == "3 robots cannot be split evenly among 2 processes"


def test_several_components_in_one_key_are_named_together() -> None:
    error = fail({"actor,inference": "0-3:0-2"})
    assert str(error).startswith("components 'actor,inference': 4 GPUs cannot be split")


class TestConfigErrors:
    @pytest.mark.parametrize(
        ("component_placement", "where", "problem", "expected"),
        [
            (
                {"actor": {"node_group": "a900", "placement": "0"}},
                "cluster.component_placement.actor.node_group",
                "unknown node group 'a900'",
                "one of 'cluster', 'node', 'a800', 'cpu', 'robot'",
            ),
            (
                {"actor": {"node_group": "a800,a900", "placement": "0"}},
                "cluster.component_placement.actor.node_group",
                "unknown node group 'a900'",
                "'a800'",
            ),
            (
                {"actor": {"node_groups": "a800", "placement": "0"}},
                "cluster.component_placement.actor",
                "unknown key 'node_groups'",
                "one of 'node_group', 'placement'",
            ),
            (
                {"actor": {"node_group": "a800", "placment": "0"}},
                "cluster.component_placement.actor",
                "unknown key 'placment'",
                "'placement'",
            ),
            (
                {"actor": {"node_group": "a800"}},
                "cluster.component_placement.actor",
                "missing 'placement'",
                "placement: a string",
            ),
            (
                {"actor": "0", "critic,actor": "1"},
                "cluster.component_placement.critic,actor",
                "placed twice",
                "one key",
            ),
            ({"actor,actor": "0"}, "cluster.component_placement", "listed twice", "each component name once"),
            ({"actor,": "0"}, "cluster.component_placement", "bad component name ''", "single commas"),
            ({"actor": None}, "cluster.component_placement.actor", "expected a placement string", "'0-7'"),
            ({"actor": True}, "cluster.component_placement.actor", "expected a placement string", "'0-7'"),
            ({"actor": 1.5}, "cluster.component_placement.actor", "expected a placement string", "'0-7'"),
            ({"actor": ["0-3"]}, "cluster.component_placement.actor", "expected a placement string", "'0-7'"),
            (
                {"actor": {"placement": {"a": 1}}},
                "cluster.component_placement.actor",
                "expected a placement string",
                "mapping {node_group, placement}",
            ),
            (
                {"actor": {"node_group": None, "placement": "0"}},
                "cluster.component_placement.actor.node_group",
                "expected node group labels, got None",
                "YAML list",
            ),
            (
                {"actor": {"node_group": [], "placement": "0"}},
                "cluster.component_placement.actor.node_group",
                "expected node group labels",
                "YAML list",
            ),
            (
                {"actor": {"node_group": ["a800", 1.5], "placement": "0"}},
                "cluster.component_placement.actor.node_group",
                "bad node group label 1.5",
                "non-empty node group labels",
            ),
            (
                {"actor": {"node_group": "a800,,cpu", "placement": "0"}},
                "cluster.component_placement.actor.node_group",
                "bad node group label ''",
                "non-empty node group labels",
            ),
        ],
    )
    def test_component_mapping(
        self, component_placement: Any, where: str, problem: str, expected: str
    ) -> None:
        error = fail(component_placement, [8, 8, 0, 0, 0])
        assert error.where == where
        assert problem in error.problem
        assert expected in error.expected

    def test_node_group_listed_twice(self) -> None:
        error = fail({"actor": {"node_group": ["a800", "a800"], "placement": "0"}}, [8, 8, 0, 0, 0])
        assert "a node group label is listed twice" in error.problem

    def test_one_process_mixing_kinds(self) -> None:
        """GPUs then a robot of the same node concatenate, but one process may not own both."""
        robot = {"type": "franka", "configs": [{"node_rank": 0, "ip": "10.0.0.8"}]}
        groups = [{"label": "gpu", "node_ranks": 0}, {"label": "arm", "node_ranks": 0, "hardware": robot}]
        cluster = {"num_nodes": 1, "node_groups": groups}
        cluster["component_placement"] = {"env": {"node_group": "gpu,arm", "placement": "0-3:0"}}
        with pytest.raises(PlacementError) as info:
            ComponentPlacement({"cluster": cluster}, ClusterSpec.from_config(cluster, 3))
        error = info.value
        assert error.where == "component 'env'"
        assert error.problem == "process 0 would own resources 0-3 of different kinds (GPU, franka)"
        assert caret(error) == (0, 3)

    def test_overlapping_groups(self) -> None:
        error = fail({"actor": {"node_group": ["a800", "cluster"], "placement": "0"}}, [8, 8, 0, 0, 0])
        assert error.where == "component 'actor'"
        assert "node 0's GPUs are offered by both node groups 'a800' and 'cluster'" in error.problem

    def test_one_group_mixing_accelerator_types(self) -> None:
        nodes = [NodeSpec(0, 8, "GPU"), NodeSpec(1, 8, "NPU")]
        cluster = parse_cluster_config({"num_nodes": 2, "component_placement": {"actor": "0"}})
        with pytest.raises(PlacementError) as info:
            ComponentPlacement({"cluster": cluster}, ClusterSpec.build(nodes, cluster))
        assert info.value.where == "component 'actor'"
        assert "node group 'cluster' mixes accelerator types ['GPU', 'NPU']" in info.value.problem

    @pytest.mark.parametrize(
        ("cfg", "where"),
        [
            ({}, "cfg.cluster"),
            ({"cluster": "x"}, "cfg.cluster"),
            ([1], "cfg.cluster"),
            ({"cluster": {"num_nodes": 1}}, "cluster.component_placement"),
            ({"cluster": {"num_nodes": 1, "component_placement": {}}}, "cluster.component_placement"),
            ({"cluster": {"num_nodes": 1, "component_placement": ["actor"]}}, "cluster.component_placement"),
        ],
    )
    def test_sections(self, cfg: Any, where: str) -> None:
        with pytest.raises(ConfigError) as info:  # the config itself, before any placement is read
            ComponentPlacement(cfg, ClusterSpec.from_config({"num_nodes": 1}))
        assert info.value.where == where

    def test_cluster_of_the_wrong_type(self) -> None:
        with pytest.raises(PlacementError, match="expected a ClusterSpec or a Cluster, got dict"):
            ComponentPlacement({"cluster": {"component_placement": {"a": "0"}}}, {"num_nodes": 1})


@pytest.fixture(scope="module")
def big() -> ClusterSpec:
    return ClusterSpec.from_config(
        {"num_nodes": 4000, "node_groups": [{"label": "odd", "node_ranks": "1-3999"}]}
    )


class TestShortOnBigClusters:
    """4,000 nodes x 8 GPUs: messages name ranges, never list every node or device."""

    @pytest.mark.parametrize(
        "entry",
        [
            "0-40000",
            "all,0",
            "0-31999:1-32000",
            "0-31998:0-1",
            "7-8:0",
            {"node_group": "node", "placement": "0-3999:0-10"},
            {"node_group": "nope", "placement": "0"},
            {"node_group": "odd,cluster", "placement": "0"},
        ],
    )
    def test_messages_stay_short(self, big: ClusterSpec, entry: Any) -> None:
        with pytest.raises(PlacementError) as info:
            ComponentPlacement({"cluster": {"component_placement": {"actor": entry}}}, big)
        assert len(str(info.value)) < 300, str(info.value)

    def test_strategy_errors_stay_short(self, big: ClusterSpec) -> None:
        strategy = rlinfra.placement.FlexiblePlacementStrategy([[0], list(range(7, 4000))])
        with pytest.raises(PlacementError) as info:
            strategy.get_placement(big)
        assert len(str(info.value)) < 300, str(info.value)


class TestOddText:
    def test_tabs_and_newlines_keep_the_caret_under_its_characters(self) -> None:
        error = fail({"actor": "0-3,\t4-x\n"})
        lines = str(error).splitlines()
        assert lines[1] == "  in: 0-3, 4-x "
        assert lines[2] == " " * (PREFIX + 5) + "^^^"
        assert error.text == "0-3,\t4-x\n", "the attribute keeps what the user wrote"
        assert "'4-x'" in error.problem

    def test_control_characters_stay_on_one_line(self) -> None:
        error = fail({"actor": "0\x1e1"})
        assert len(str(error).splitlines()) == 4
        assert "'0\\x1e1'" in error.problem

    @pytest.mark.parametrize(
        ("value", "where", "problem"),
        [
            ("${missing}", "cluster.component_placement.actor", "Interpolation key 'missing' not found"),
            (
                "${oc.env:RLINFRA_TEST_UNSET_VARIABLE}",
                "cluster.component_placement.actor",
                "RLINFRA_TEST_UNSET",
            ),
        ],
    )
    def test_broken_interpolation(self, value: str, where: str, problem: str) -> None:
        cfg = OmegaConf.create({"cluster": {"num_nodes": 1, "component_placement": {"actor": value}}})
        with pytest.raises(ConfigError) as info:  # the config itself, before any placement is read
            ComponentPlacement(cfg, ClusterSpec.from_config({"num_nodes": 1}))
        assert info.value.where == where
        assert problem in info.value.problem
        assert "cannot resolve the config" in info.value.problem

    def test_broken_interpolation_in_the_cluster_section(self) -> None:
        cfg = OmegaConf.create({"cluster": {"num_nodes": "${nodes}"}})
        with pytest.raises(ConfigError) as info:
            ClusterSpec.from_config(cfg.cluster)
        assert info.value.where == "cluster.num_nodes"


class TestErrorType:
    def test_is_a_value_error_exported_at_the_top(self) -> None:
        assert rlinfra.PlacementError is PlacementError
        assert issubclass(PlacementError, ValueError)

    def test_within_keeps_everything_but_the_place(self) -> None:
        error = PlacementError("bad", text="0-3", span=Span(2, 3), expected="good")
        moved = error.within("component 'x'")
        assert str(moved) == "component 'x': bad\n  in: 0-3\n        ^\n  expected: good"
        assert str(error) == "bad\n  in: 0-3\n        ^\n  expected: good"

    def test_render_without_text_or_expected(self) -> None:
        assert str(PlacementError("bad")) == "bad"
        assert str(PlacementError("bad", where="here", text="x")) == "here: bad\n  in: x"

    @pytest.mark.parametrize(
        ("ranks", "expected"),
        [
            ([], "(none)"),
            ([3], "3"),
            ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"),
            (list(range(0, 40, 2)), "0,2,4,6,8,10,… (20 in all)"),
            ((4, 5), "4-5"),
        ],
    )
    def test_short_ranks(self, ranks: list[int], expected: str) -> None:
        assert short_ranks(ranks) == expected
