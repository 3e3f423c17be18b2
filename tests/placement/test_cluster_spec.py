"""``ClusterSpec``: nodes, accelerators, node groups, custom hardware, env_configs, ``--nodes``."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import yaml
from omegaconf import OmegaConf

from rlinfra.placement import (
    CLUSTER_GROUP,
    NODE_GROUP,
    ClusterConfig,
    ClusterSpec,
    EnvConfig,
    HardwareUnit,
    NodeSpec,
    PlacementError,
)
from rlinfra.placement.config import MAX_NODES, parse_nodes_spec

PREFIX = len("  in: ")


def spec_error(cluster: dict, accelerators: object = 8) -> PlacementError:
    with pytest.raises(PlacementError) as info:
        ClusterSpec.from_config(cluster, accelerators)
    return info.value


def groups(*entries: dict, num_nodes: int = 4) -> dict:
    return {"num_nodes": num_nodes, "node_groups": list(entries)}


class TestNodes:
    def test_uniform_accelerators(self) -> None:
        spec = ClusterSpec.from_config({"num_nodes": 3})
        assert spec.nodes == (NodeSpec(0, 8, "GPU"), NodeSpec(1, 8, "GPU"), NodeSpec(2, 8, "GPU"))
        assert spec.num_nodes == 3
        assert spec.num_accelerators == 24

    def test_per_node_accelerators_and_type(self) -> None:
        spec = ClusterSpec.from_config({"num_nodes": 3}, [8, 4, 0], accelerator_type="NPU")
        assert [(n.rank, n.num_accelerators, n.accelerator_type) for n in spec.nodes] == [
            (0, 8, "NPU"),
            (1, 4, "NPU"),
            (2, 0, "NPU"),
        ]
        assert spec.describe() == "3 nodes, 12 NPU"

    def test_cpu_only_describe(self) -> None:
        assert ClusterSpec.from_config({"num_nodes": 1}, 0).describe() == "1 node"

    def test_reserved_groups_cover_every_node(self) -> None:
        spec = ClusterSpec.from_config({"num_nodes": 3})
        assert spec.node_groups[CLUSTER_GROUP].node_ranks == (0, 1, 2)
        assert spec.node_groups[NODE_GROUP].node_ranks == (0, 1, 2)
        assert spec.node_groups[NODE_GROUP].ignore_hardware
        assert not spec.node_groups[CLUSTER_GROUP].ignore_hardware

    @pytest.mark.parametrize(
        ("cluster", "accelerators", "where", "problem"),
        [
            ({}, 8, "cluster", "missing 'num_nodes'"),
            ({"num_nodes": 0}, 8, "cluster.num_nodes", "got 0; expected at least 1"),
            ({"num_nodes": True}, 8, "cluster.num_nodes", "expected int, got True"),
            ({"num_nodes": "2"}, 8, "cluster.num_nodes", "expected int, got '2'"),
            ({"num_nodes": 10**12}, 8, "cluster.num_nodes", "expected at most 100000"),
            ({"num_nodes": 2}, -1, "accelerators per node", "-1 is too small"),
            ({"num_nodes": 2}, [8], "accelerators per node", "1 node given, but cluster.num_nodes is 2"),
            ({"num_nodes": 2}, [8, "8"], "accelerators per node[1]", "expected an integer"),
            ({"num_nodes": 2}, None, "accelerators per node", "expected an int or a list"),
            ({"num_nodes": 2}, True, "accelerators per node", "expected an int or a list"),
        ],
    )
    def test_bad_node_description(
        self, cluster: dict, accelerators: object, where: str, problem: str
    ) -> None:
        error = spec_error(cluster, accelerators)
        assert error.where == where
        assert problem in error.problem

    def test_cluster_section_must_be_a_mapping(self) -> None:
        error = spec_error(["num_nodes", 2])  # type: ignore[arg-type]
        assert error.where == "cluster"
        assert "expected a mapping, got list" in error.problem

    def test_build_sorts_nodes_and_rejects_gaps(self) -> None:
        spec = ClusterSpec.build([NodeSpec(1, 4), NodeSpec(0, 8)], ClusterConfig(num_nodes=2))
        assert [n.rank for n in spec.nodes] == [0, 1]
        with pytest.raises(PlacementError, match="without gaps"):
            ClusterSpec.build([NodeSpec(0), NodeSpec(2)], ClusterConfig(num_nodes=2))

    def test_accepts_omegaconf(self) -> None:
        cfg = OmegaConf.create({"num_nodes": 2, "node_groups": [{"label": "a", "node_ranks": [1]}]})
        spec = ClusterSpec.from_config(cfg)
        assert spec.node_groups["a"].node_ranks == (1,)


class TestNodeGroups:
    @pytest.mark.parametrize(
        ("node_ranks", "expected"),
        [
            (2, (2,)),
            ("0-1", (0, 1)),
            ("3,0-1", (0, 1, 3)),
            ([3, "0-1"], (0, 1, 3)),
            ([2, 0], (0, 2)),
        ],
    )
    def test_node_ranks_forms_are_sorted(self, node_ranks: object, expected: tuple[int, ...]) -> None:
        spec = ClusterSpec.from_config(groups({"label": "g", "node_ranks": node_ranks}))
        assert spec.node_groups["g"].node_ranks == expected

    def test_yaml_lists_for_node_ranks(self) -> None:
        text = """
num_nodes: 4
node_groups:
  - label: a
    node_ranks: [3, 1]
  - label: b
    node_ranks:
      - 0
      - "2"
"""
        for cfg in (yaml.safe_load(text), OmegaConf.create(text)):
            spec = ClusterSpec.from_config(cfg)
            assert spec.node_groups["a"].node_ranks == (1, 3)
            assert spec.node_groups["b"].node_ranks == (0, 2)

    def test_numeric_label_from_yaml(self) -> None:
        """The seed names a group ``4090``; YAML reads that as an int."""
        cfg = yaml.safe_load("num_nodes: 4\nnode_groups:\n  - label: 4090\n    node_ranks: 2-3\n")
        assert cfg["node_groups"][0]["label"] == 4090
        spec = ClusterSpec.from_config(cfg)
        assert spec.node_groups["4090"].node_ranks == (2, 3)

    def test_label_is_stripped(self) -> None:
        spec = ClusterSpec.from_config(groups({"label": " a800 ", "node_ranks": 0}))
        assert "a800" in spec.node_groups

    @pytest.mark.parametrize(
        ("entry", "where", "problem"),
        [
            ({"node_ranks": 0}, "cluster.node_groups[0].label", "expected a non-empty string, got None"),
            ({"label": "", "node_ranks": 0}, "cluster.node_groups[0].label", "non-empty string"),
            ({"label": True, "node_ranks": 0}, "cluster.node_groups[0].label", "non-empty string"),
            ({"label": "a,b", "node_ranks": 0}, "cluster.node_groups[0].label", "contains a comma"),
            ({"label": "cluster", "node_ranks": 0}, "cluster.node_groups[0].label", "is reserved"),
            ({"label": "node", "node_ranks": 0}, "cluster.node_groups[0].label", "is reserved"),
            ({"label": "g"}, "cluster.node_groups[0]", "missing 'node_ranks'"),
            ({"label": "g", "node_ranks": 4}, "cluster.node_groups[0].node_ranks", "does not exist"),
            ({"label": "g", "node_ranks": "0-9"}, "cluster.node_groups[0].node_ranks", "does not exist"),
            ({"label": "g", "node_ranks": [0, 0]}, "cluster.node_groups[0].node_ranks", "listed twice"),
            ({"label": "g", "node_ranks": []}, "cluster.node_groups[0].node_ranks", "empty"),
            ({"label": "g", "node_rank": 0}, "cluster.node_groups[0]", "unknown key 'node_rank'"),
            (
                {"label": "g", "node_ranks": 0, "ignore_hardwar": True},
                "cluster.node_groups[0]",
                "unknown key 'ignore_hardwar'",
            ),
            (
                {"label": "g", "node_ranks": 0, "ignore_hardware": "yes"},
                "cluster.node_groups[0].ignore_hardware",
                "expected true or false",
            ),
            ("g", "cluster.node_groups[0]", "expected a mapping, got str"),
        ],
    )
    def test_bad_group(self, entry: object, where: str, problem: str) -> None:
        error = spec_error(groups(entry))
        assert error.where == where
        assert problem in error.problem

    def test_unknown_field_lists_the_allowed_ones(self) -> None:
        error = spec_error(groups({"label": "g", "nodes": 0}))
        assert "'node_ranks'" in error.expected
        assert "'label'" in error.expected

    def test_duplicate_label(self) -> None:
        error = spec_error(groups({"label": "g", "node_ranks": 0}, {"label": "g", "node_ranks": 1}))
        assert error.where == "cluster.node_groups[1].label"
        assert "already defined" in error.problem

    def test_node_groups_must_be_a_list(self) -> None:
        error = spec_error({"num_nodes": 1, "node_groups": {"label": "g", "node_ranks": 0}})
        assert error.where == "cluster.node_groups"

    def test_node_rank_past_the_cluster_in_a_range_string_has_a_caret(self) -> None:
        error = spec_error(groups({"label": "g", "node_ranks": "0,2-5"}))
        assert "node rank 5 does not exist" in error.problem
        assert "  in: 0,2-5\n" + " " * (PREFIX + 2) + "^^^\n" in str(error)
        assert error.expected == "node ranks within 0-3 (cluster.num_nodes is 4)"

    def test_huge_node_range_is_an_error_not_a_hang(self) -> None:
        error = spec_error(groups({"label": "g", "node_ranks": "0-99999999999999"}))
        assert "does not exist" in error.problem

    def test_errors_about_long_rank_lists_stay_short(self) -> None:
        big = 4000
        for node_ranks in (list(range(big + 1)), [*range(big - 1), 0]):
            error = spec_error(groups({"label": "g", "node_ranks": node_ranks}, num_nodes=big), 0)
            assert len(str(error)) < 300, str(error)


class TestHardware:
    ROBOTS: ClassVar[dict[str, Any]] = {
        "label": "robot",
        "node_ranks": "4-5",
        "hardware": {
            "type": "robot",
            "configs": [
                {"node_rank": 5, "ip": "10.0.0.12"},
                {"node_rank": 4, "ip": "10.0.0.10"},
                {"node_rank": 4, "ip": "10.0.0.11"},
                {"node_rank": 5, "ip": "10.0.0.13"},
            ],
        },
    }

    def test_units_are_numbered_per_node_in_node_order(self) -> None:
        spec = ClusterSpec.from_config(groups(self.ROBOTS, num_nodes=6), [8, 8, 8, 8, 0, 0])
        group = spec.node_groups["robot"]
        assert group.hardware_type == "robot"
        assert [(u.node_rank, u.index, u.fields["ip"]) for u in group.hardware] == [
            (4, 0, "10.0.0.10"),
            (4, 1, "10.0.0.11"),
            (5, 0, "10.0.0.12"),
            (5, 1, "10.0.0.13"),
        ]
        assert all("node_rank" not in u.fields for u in group.hardware)
        assert group.hardware[0] == HardwareUnit("robot", 4, 0)
        assert spec.describe() == "6 nodes, 32 GPU, 4 robot (robot)"

    @pytest.mark.parametrize(
        ("hardware", "where", "problem"),
        [
            (
                {"type": "robot", "configs": [{"node_rank": 0}]},
                "cluster.node_groups[0].hardware.configs[0].node_rank",
                "node rank 0 is not in this node group",
            ),
            (
                {"type": "robot", "configs": [{"node_rank": 1}, {"node_rank": 3}]},
                "cluster.node_groups[0].hardware.configs[1].node_rank",
                "node rank 3 is not in this node group",
            ),
            (
                {"type": "robot", "configs": [{"ip": "x"}]},
                "cluster.node_groups[0].hardware.configs[0].node_rank",
                "expected an integer, got None",
            ),
            ({"type": "robot"}, "cluster.node_groups[0].hardware.configs", "at least one unit"),
            ({"type": "robot", "configs": []}, "cluster.node_groups[0].hardware.configs", "at least one"),
            (
                {"type": "robot", "configs": {"node_rank": 1}},
                "cluster.node_groups[0].hardware.configs",
                "one",
            ),
            ({"configs": [{"node_rank": 1}]}, "cluster.node_groups[0].hardware.type", "non-empty string"),
            (
                {"type": "Node", "configs": [{"node_rank": 1}]},
                "cluster.node_groups[0].hardware.type",
                "reserved",
            ),
            (
                {"type": "robot", "config": [{"node_rank": 1}]},
                "cluster.node_groups[0].hardware",
                "unknown key 'config'",
            ),
            ("robot", "cluster.node_groups[0].hardware", "expected a mapping"),
            (
                {"type": "robot", "configs": ["node 1"]},
                "cluster.node_groups[0].hardware.configs[0]",
                "expected a mapping",
            ),
        ],
    )
    def test_bad_hardware(self, hardware: object, where: str, problem: str) -> None:
        error = spec_error(groups({"label": "r", "node_ranks": "1-2", "hardware": hardware}))
        assert error.where == where
        assert problem in error.problem

    def test_outside_node_rank_names_the_group_members(self) -> None:
        hardware = {"type": "robot", "configs": [{"node_rank": 0}]}
        error = spec_error(groups({"label": "r", "node_ranks": "1-2", "hardware": hardware}))
        assert "1-2" in error.expected


class TestEnvConfigs:
    def cfg(self, env_configs: object) -> dict:
        return groups({"label": "g", "node_ranks": "1-2", "env_configs": env_configs})

    def test_mapping_form(self) -> None:
        env = [
            {
                "node_ranks": 2,
                "env_vars": {"A": "1", "B": 2, "C": True},
                "python_interpreter_path": "/opt/py/bin/python",
            }
        ]
        (config,) = ClusterSpec.from_config(self.cfg(env)).node_groups["g"].env_configs
        assert config == EnvConfig((2,), python_interpreter_path="/opt/py/bin/python")
        assert dict(config.env_vars) == {"A": "1", "B": "2", "C": "True"}

    def test_rlinf_list_of_one_key_mappings(self) -> None:
        text = """
num_nodes: 4
node_groups:
  - label: g
    node_ranks: 1-2
    env_configs:
      - node_ranks: [1, 2]
        env_vars:
          - MUJOCO_GL: egl
          - PYOPENGL_PLATFORM: egl
      - env_vars:
          - X: 1
"""
        for cfg in (yaml.safe_load(text), OmegaConf.create(text)):
            first, second = ClusterSpec.from_config(cfg).node_groups["g"].env_configs
            assert first.node_ranks == (1, 2)
            assert dict(first.env_vars) == {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl"}
            assert first.python_interpreter_path is None
            assert second.node_ranks == (1, 2), "node_ranks default to the whole group"
            assert dict(second.env_vars) == {"X": "1"}

    def test_no_env_vars(self) -> None:
        (config,) = ClusterSpec.from_config(self.cfg([{"node_ranks": 1}])).node_groups["g"].env_configs
        assert dict(config.env_vars) == {}

    @pytest.mark.parametrize(
        ("env_configs", "where", "problem"),
        [
            ({"node_ranks": 1}, "cluster.node_groups[0].env_configs", "expected a list"),
            (
                [{"node_ranks": 0}],
                "cluster.node_groups[0].env_configs[0].node_ranks",
                "not in this node group",
            ),
            ([{"node_ranks": 7}], "cluster.node_groups[0].env_configs[0].node_ranks", "does not exist"),
            ([{"env": {"A": 1}}], "cluster.node_groups[0].env_configs[0]", "unknown key 'env'"),
            ([{"env_vars": "A=1"}], "cluster.node_groups[0].env_configs[0].env_vars", "expected a mapping"),
            (
                [{"env_vars": {"A": None}}],
                "cluster.node_groups[0].env_configs[0].env_vars",
                "no scalar value",
            ),
            ([{"env_vars": {"A": [1]}}], "cluster.node_groups[0].env_configs[0].env_vars", "no scalar value"),
            ([{"env_vars": [{"A": {"B": 1}}]}], "cluster.node_groups[0].env_configs[0].env_vars", "scalar"),
            (
                [{"env_vars": ["A=1"]}],
                "cluster.node_groups[0].env_configs[0].env_vars[0]",
                "expected a mapping",
            ),
            ([{"env_vars": {1: "x"}}], "cluster.node_groups[0].env_configs[0].env_vars", "bad variable name"),
            (
                [{"python_interpreter_path": ""}],
                "cluster.node_groups[0].env_configs[0].python_interpreter_path",
                "non-empty string",
            ),
            (["A=1"], "cluster.node_groups[0].env_configs[0]", "expected a mapping"),
        ],
    )
    def test_bad_env_configs(self, env_configs: object, where: str, problem: str) -> None:
        error = spec_error(self.cfg(env_configs))
        assert error.where == where
        assert problem in error.problem


class TestParseNodesSpec:
    @pytest.mark.parametrize(
        ("spec", "expected"),
        [
            ("2x8", [8, 8]),
            (" 3 X 4 ", [4, 4, 4]),
            ("1x0", [0]),
            ("8,8,4,0", [8, 8, 4, 0]),
            (" 8 , 2 ", [8, 2]),
            ("4", [4]),
            (4, [4]),
            ([8, 0], [8, 0]),
            ((2, 2), [2, 2]),
        ],
    )
    def test_forms(self, spec: object, expected: list[int]) -> None:
        assert parse_nodes_spec(spec) == expected

    @pytest.mark.parametrize(
        ("spec", "problem", "column", "width"),
        [
            ("8,x,4", "cannot read 'x'", 2, 1),
            ("8,,4", "cannot read ''", 2, 1),
            ("8, -1", "cannot read '-1'", 3, 2),
            ("2x8x", "cannot read '2x8x'", 0, 4),
            ("", "cannot read ''", 0, 1),
        ],
    )
    def test_errors_with_caret(self, spec: str, problem: str, column: int, width: int) -> None:
        with pytest.raises(PlacementError) as info:
            parse_nodes_spec(spec)
        error = info.value
        assert error.where == "--nodes"
        assert problem in error.problem
        caret_line = str(error).splitlines()[2]
        assert caret_line == " " * (PREFIX + column) + "^" * width
        assert "'2x8'" in error.expected

    @pytest.mark.parametrize(
        ("spec", "problem"),
        [
            ("0x8", "no nodes"),
            ([], "no nodes"),
            (f"{MAX_NODES + 1}x8", "too many nodes"),
            ("9" * 5000 + "x8", "too many nodes"),
            ("1x" + "9" * 5000, "too large"),
            ("9" * 5000, "cannot read"),
            ([8, -1], "too small"),
            ([8, True], "expected an integer"),
        ],
    )
    def test_other_errors(self, spec: object, problem: str) -> None:
        with pytest.raises(PlacementError, match=problem):
            parse_nodes_spec(spec)

    def test_where_is_configurable(self) -> None:
        with pytest.raises(PlacementError, match=r"^cluster\.simulate: "):
            parse_nodes_spec("x", where="cluster.simulate")

    def test_feeds_from_config(self) -> None:
        counts = parse_nodes_spec("8,4,2")
        spec = ClusterSpec.from_config({"num_nodes": len(counts)}, counts)
        assert spec.num_accelerators == 14
