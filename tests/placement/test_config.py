"""The cluster section, parsed once: every key known, nothing silently dropped, RLinf's spellings
accepted, and one component spanning node groups of different kinds (GPUs and robots)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rlinfra.cli.main import app
from rlinfra.placement import (
    ClusterSpec,
    ComponentPlacement,
    FlexiblePlacementStrategy,
    PackedPlacementStrategy,
    PlacementError,
    parse_cluster_config,
)
from rlinfra.placement.errors import Span

ARM = {"type": "franka", "configs": [{"node_rank": 0, "robot_ip": "10.0.0.8"}]}
# RLinf's multi-kind example: a node with 4 GPUs and one Franka arm, in two node groups.
GPU_AND_ARM = [{"label": "gpu", "node_ranks": 0}, {"label": "franka", "node_ranks": 0, "hardware": ARM}]


def parsed(**section: Any) -> Any:
    return parse_cluster_config({"num_nodes": 2, **section})


def refused(**section: Any) -> PlacementError:
    with pytest.raises(PlacementError) as caught:
        parsed(**section)
    return caught.value


class TestUnknownKeys:
    @pytest.mark.parametrize(
        ("section", "where", "problem"),
        [
            ({"node_grups": []}, "cluster", "unknown key 'node_grups'; did you mean 'node_groups'?"),
            ({"simulate_cpu": 4}, "cluster", "unknown key 'simulate_cpu'; did you mean 'simulate_cpus'?"),
            ({"nsight": {}}, "cluster", "unknown key 'nsight'"),
            (
                {"component_placement": {"a": {"placement": "0", "num_cpu": 1}}},
                "cluster.component_placement.a",
                "unknown key 'num_cpu'; did you mean 'num_cpus'?",
            ),
            (
                {"node_groups": [{"label": "a", "node_ranks": 0, "hardwre": {}}]},
                "cluster.node_groups[0]",
                "unknown key 'hardwre'; did you mean 'hardware'?",
            ),
            (
                {"node_groups": [{"label": "a", "node_ranks": 0, "env_configs": [{"env_var": {}}]}]},
                "cluster.node_groups[0].env_configs[0]",
                "unknown key 'env_var'; did you mean 'env_vars'?",
            ),
            # keys that look like pydantic's names of union branches are still the user's keys
            (
                {"component_placement": {"a": {"placement": "0", "[": None}}},
                "cluster.component_placement.a",
                "unknown key '['",
            ),
            (
                {"component_placement": {"a": {"placement": "0", "int": 1}}},
                "cluster.component_placement.a",
                "unknown key 'int'",
            ),
        ],
    )
    def test_are_refused_with_the_nearest_valid_key(self, section: Any, where: str, problem: str) -> None:
        error = refused(**section)
        assert (error.where, error.problem) == (where, problem)
        assert error.expected is not None and error.expected.startswith("one of ")

    def test_every_documented_key_is_accepted_and_typed(self) -> None:
        config = parsed(
            component_placement={"a": {"placement": "0-1", "num_cpus": 2}},
            simulate="2x2",
            simulate_cpus=8,
            simulate_object_store_mib=128,
            simulate_resources=[{"nvlink_domain_0": 2}, {}],
            simulate_labels=[{"zone": "a"}, {"zone": "b"}],
            node_timeout=5,
            secrets={"HF_TOKEN": {"from_env": "HF_TOKEN"}},
            env_allowlist=["WANDB_*"],
        )
        assert config.simulate == (2, 2) and config.simulate_cpus == 8
        assert config.simulate_resources == ({"nvlink_domain_0": 2}, {})
        assert config.components[0].names == ("a",) and config.components[0].num_cpus == 2.0
        assert [spec.name for spec in config.secrets] == ["HF_TOKEN"]
        assert config.env_allowlist == ("WANDB_*",)

    def test_an_unwritten_simulate_size_stays_unset(self) -> None:
        """So that a written one (even the default's value) can be refused where it cannot be honoured."""
        assert parsed(simulate="2x2").simulate_cpus is None
        assert parsed(simulate="2x2", simulate_cpus=16).simulate_cpus == 16

    @pytest.mark.parametrize(
        ("section", "problem"),
        [
            ({"simulate_cpus": 4}, "only used with cluster.simulate"),
            ({"simulate_labels": [{}, {}]}, "only used with cluster.simulate"),
            ({"simulate": "2x2", "address": "ray://head:10001"}, "cluster.simulate and cluster.address"),
            ({"simulate": "3x2"}, "3 nodes given, but cluster.num_nodes is 2"),
            ({"node_timeout": 0}, "got 0; expected above 0"),
            ({"component_placement": {"a": {"placement": "0", "num_cpus": -1}}}, "expected at least 0 (CPUs"),
            (
                {"component_placement": {"a": {"placement": "0", "num_cpus": "two"}}},
                "expected float, got 'two'",
            ),
        ],
    )
    def test_settings_nothing_would_use_or_that_cannot_work_are_refused(
        self, section: Any, problem: str
    ) -> None:
        assert problem in refused(**section).problem


class TestRlinfSpellings:
    @pytest.mark.parametrize("written", ["all", "ALL", "All"])
    def test_node_ranks_all_in_groups_and_env_configs(self, written: str) -> None:
        group = {
            "label": "g",
            "node_ranks": written,
            "env_configs": [{"node_ranks": written, "env_vars": {"A": "1"}}],
        }
        (parsed_group,) = parsed(node_groups=[group]).node_groups
        assert parsed_group.node_ranks == (0, 1)
        assert parsed_group.env_configs[0].node_ranks == (0, 1)

    def test_env_configs_all_means_the_groups_nodes(self) -> None:
        group = {"label": "g", "node_ranks": 1, "env_configs": [{"node_ranks": "all"}]}
        (parsed_group,) = parsed(node_groups=[group]).node_groups
        assert parsed_group.env_configs[0].node_ranks == (1,)

    def test_env_vars_as_a_list_of_one_key_mappings(self) -> None:
        group = {"label": "g", "node_ranks": 0, "env_configs": [{"env_vars": [{"A": "1"}, {"B": 2}]}]}
        (parsed_group,) = parsed(node_groups=[group]).node_groups
        assert dict(parsed_group.env_configs[0].env_vars) == {"A": "1", "B": "2"}


class TestHardware:
    def test_identical_entries_on_one_node_are_refused(self) -> None:
        twice = {"type": "franka", "configs": [{"node_rank": 0, "robot_ip": "10.0.0.8"}] * 2}
        error = refused(node_groups=[{"label": "arm", "node_ranks": 0, "hardware": twice}])
        assert error.where == "cluster.node_groups[0].hardware.configs[1]"
        assert error.problem.startswith("configs[1] repeats configs[0] on node 0")

    def test_same_fields_on_different_nodes_are_two_units(self) -> None:
        two = {"type": "cam", "configs": [{"node_rank": 0, "serial": "x"}, {"node_rank": 1, "serial": "x"}]}
        (group,) = parsed(node_groups=[{"label": "cams", "node_ranks": "0-1", "hardware": two}]).node_groups
        assert [(unit.node_rank, unit.index) for unit in group.hardware] == [(0, 0), (1, 0)]

    def test_one_nodes_units_of_a_type_in_two_groups_are_refused(self) -> None:
        groups = [
            {"label": "a", "node_ranks": 0, "hardware": ARM},
            {
                "label": "b",
                "node_ranks": 0,
                "hardware": {"type": "franka", "configs": [{"node_rank": 0, "robot_ip": "x"}]},
            },
        ]
        assert (
            "node 0's franka hardware is declared by node groups 'a' and 'b'"
            in refused(node_groups=groups).problem
        )

    def test_ignore_hardware_with_hardware_is_refused(self) -> None:
        group = {"label": "a", "node_ranks": 0, "hardware": ARM, "ignore_hardware": True}
        assert "cannot declare hardware" in refused(node_groups=[group]).problem


class TestInterpreter:
    def test_relative_path_is_refused_with_a_caret(self) -> None:
        group = {
            "label": "g",
            "node_ranks": 0,
            "env_configs": [{"python_interpreter_path": "venv/bin/python"}],
        }
        error = refused(node_groups=[group])
        assert error.where == "cluster.node_groups[0].env_configs[0].python_interpreter_path"
        assert (error.text, error.span) == ("venv/bin/python", Span(0, 15))
        assert "relative" in error.problem

    def test_two_interpreters_for_one_node_are_refused(self) -> None:
        configs = [
            {"node_ranks": "0-1", "python_interpreter_path": "/opt/a/python"},
            {"node_ranks": 1, "python_interpreter_path": "/opt/b/python"},
        ]
        error = refused(node_groups=[{"label": "g", "node_ranks": "0-1", "env_configs": configs}])
        assert (
            "node 1 gets python_interpreter_path '/opt/a/python' from entry 0 and '/opt/b/python'"
            in error.problem
        )


class TestMultiKindPlacement:
    """RLinf: ``{node_group: "gpu,franka", placement: "0,4"}`` on a node with 4 GPUs and a Franka."""

    def spec(self) -> ClusterSpec:
        return ClusterSpec.from_config({"num_nodes": 1, "node_groups": GPU_AND_ARM}, 4)

    def test_component_placement(self) -> None:
        cfg = {
            "cluster": {
                "num_nodes": 1,
                "node_groups": GPU_AND_ARM,
                "component_placement": {"env": {"node_group": "gpu,franka", "placement": "0,4"}},
            }
        }
        placement = ComponentPlacement(cfg, self.spec())
        gpu, arm = placement.get_placements("env")
        assert (gpu.hardware_type, gpu.local_hardware_ranks, gpu.visible_devices) == ("GPU", [0], "0")
        assert (gpu.node_group_label, gpu.visibility_env) == ("gpu", {"CUDA_VISIBLE_DEVICES": "0"})
        assert (arm.hardware_type, arm.local_hardware_ranks, arm.visible_devices) == ("franka", [0], None)
        assert (arm.node_group_label, arm.visibility_env, arm.hardware_ranks) == ("franka", {}, [4])
        assert (gpu.local_rank, arm.local_rank, arm.local_world_size) == (0, 1, 2)
        assert placement.get_hardware_ranks("env") == [0, 4]

    def test_strategies_by_hand(self) -> None:
        spec = self.spec()
        flexible = FlexiblePlacementStrategy([[4], [0]], node_group_label=["gpu", "franka"]).get_placement(
            spec
        )
        packed = PackedPlacementStrategy(0, 4, node_group=["gpu", "franka"]).get_placement(spec)
        for placements in (flexible, packed[::4]):
            assert [(p.hardware_type, p.hardware_ranks) for p in placements] == [
                ("GPU", [0]),
                ("franka", [4]),
            ]
        assert [p.hardware_type for p in packed] == ["GPU"] * 4 + ["franka"]

    def test_one_process_may_not_own_two_kinds(self) -> None:
        with pytest.raises(PlacementError, match="process 0 would own resources 3-4 of different kinds"):
            FlexiblePlacementStrategy([[3, 4]], node_group_label="gpu,franka").get_placement(self.spec())


REFUSED_CONFIGS = {
    "typo": "cluster:\n  num_nodes: 1\n  node_grups: []\n  component_placement: {a: '0'}\n",
    "twice": (
        "cluster:\n  num_nodes: 1\n  component_placement: {a: {node_group: arm, placement: '0'}}\n"
        "  node_groups:\n    - label: arm\n      node_ranks: 0\n      hardware:\n        type: franka\n"
        "        configs: [{node_rank: 0, ip: x}, {node_rank: 0, ip: x}]\n"
    ),
    "relative": (
        "cluster:\n  num_nodes: 1\n  component_placement: {a: '0'}\n  node_groups:\n"
        "    - {label: g, node_ranks: 0, env_configs: [{python_interpreter_path: bin/python}]}\n"
    ),
    "profiling": "cluster:\n  num_nodes: 1\n  component_placement: {a: '0'}\n  profiling: {backend: x}\n",
    "num_cpus": "cluster:\n  num_nodes: 1\n  component_placement: {a: {placement: '0', num_cpus: -2}}\n",
}


@pytest.mark.parametrize("name", sorted(REFUSED_CONFIGS))
def test_each_refused_input_exits_2_from_plan_without_a_traceback(name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(REFUSED_CONFIGS[name])
    result = CliRunner().invoke(
        app, ["plan", str(path), "--nodes", "1x8"], env={"COLUMNS": "200", "NO_COLOR": "1"}
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.output


class TestRlinfClusterKeys:
    """Keys RLinf's own configs carry in ``cluster``, found by placing RLinf's configs with both."""

    def test_num_gpus_per_node_sizes_a_dry_run_and_is_checked_on_a_cluster(self, tmp_path: Path) -> None:
        path = tmp_path / "conf.yaml"
        path.write_text(
            "cluster:\n  num_nodes: 2\n  num_gpus_per_node: 4\n  component_placement: {actor: all}\n"
        )
        result = CliRunner().invoke(app, ["plan", str(path), "--json"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["components"]["actor"]["world_size"] == 8
        spec = ClusterSpec.from_config({"num_nodes": 2}, [4, 2])
        with pytest.raises(PlacementError, match="num_gpus_per_node is 4, but node 1 has 2"):
            spec.check_accelerators_per_node(4)
        spec.check_accelerators_per_node(None)
        assert "cluster.simulate gives [2, 2]" in refused(simulate="2x2", num_gpus_per_node=8).problem

    def test_the_dynamic_scheduler_is_refused_by_name(self) -> None:
        error = refused(auto_scheduler=True, assign_policy="greedy")
        assert error.where == "cluster.auto_scheduler"
        assert error.problem.startswith("auto_scheduler, assign_policy: RLinf's dynamic scheduler")
        assert parsed(auto_scheduler=False).num_nodes == 2  # what rlinfra does anyway
        assert "monitor_interval" in refused(auto_scheduler=False, monitor_interval=1).problem

    def test_profiling_is_refused_by_name_with_what_to_do_instead(self) -> None:
        error = refused(profiling={"backend": "nsight", "worker_groups": "all"})
        assert error.where == "cluster.profiling"
        assert "rlinfra does not wrap workers in a profiler" in error.problem
        assert (
            error.expected is not None and "py-spy" in error.expected and "placement.json" in error.expected
        )
