"""``rlinfra plan``: the JSON contract, the table and map, SVG, and clean exits on user errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlinfra.cli.main import app
from rlinfra.views.plan_view import format_ranks

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "placement"
SEED = EXAMPLES / "seed_node_groups.yaml"
ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def invoke(*args: str | Path):
    return CliRunner().invoke(app, ["plan", *map(str, args)], env=ENV)


def write(tmp_path: Path, text: str, name: str = "conf.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def assert_user_error(result, *fragments: str) -> None:
    """Exit 2, the message on stderr, nothing on stdout, and no traceback anywhere."""
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    for fragment in fragments:
        assert fragment in result.stderr


# --- success paths -----------------------------------------------------------------------------


def test_json_of_the_seed_example() -> None:
    result = invoke(SEED, "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["cluster"]["nodes"] == [8, 8, 8, 8, 0, 0]
    components = plan["components"]
    assert {name: c["world_size"] for name, c in components.items()} == {
        "actor": 9,
        "rollout": 9,
        "env": 8,
        "agent": 512,
    }
    assert components["env"]["node_groups"] == ["robot"]
    assert components["agent"]["placement"] == "0-1:0-200,2-3:201-511"
    assert all(len(c["placements"]) == c["world_size"] for c in components.values())

    actor_8 = components["actor"]["placements"][8]
    assert (actor_8["cluster_node_rank"], actor_8["local_hardware_ranks"]) == (1, [0])
    assert actor_8["visible_devices"] == "0"
    assert components["rollout"]["placements"][0]["cluster_node_rank"] == 2
    env_5 = components["env"]["placements"][5]
    assert env_5["hardware_type"] == "robot"
    assert (env_5["cluster_node_rank"], env_5["hardware_ranks"], env_5["local_hardware_ranks"]) == (
        5,
        [2],
        [0],
    )
    assert env_5["visible_devices"] is None
    agents = components["agent"]["placements"]
    assert [agents[r]["cluster_node_rank"] for r in (0, 100, 101, 200, 201, 511)] == [0, 0, 1, 1, 2, 3]
    assert agents[511]["local_hardware_ranks"] == []


def test_json_keeps_stdout_pure_when_assuming_eight_per_node(tmp_path: Path) -> None:
    config = write(tmp_path, "cluster:\n  num_nodes: 2\n  component_placement:\n    actor: 0-15\n")
    result = invoke(config, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["cluster"]["nodes"] == [8, 8]
    assert "assuming 8" in result.stderr


def test_table_and_map_of_the_seed_example() -> None:
    result = invoke(SEED)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "6 nodes, 32 GPU, 4 robot (robot)" in out
    for name in ("actor", "rollout", "env", "agent"):
        assert name in out
    assert "Node × device map" in out
    assert "rollout 8" in out  # GPU 0 of node 3
    assert "agent 0-100 (101)" in out  # whole-node column
    assert "robot1: env 6,7" in out  # hardware column
    assert "… 492 more" in out  # agent's 512 ranks, truncated to 16 + 4


def test_components_in_one_key_share_a_table() -> None:
    result = invoke(EXAMPLES / "colocated.yaml")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("placement '0-7'") == 1
    assert "actor, rollout" in result.stdout


def test_two_processes_per_gpu_on_the_map() -> None:
    result = invoke(EXAMPLES / "disaggregated.yaml")
    assert result.exit_code == 0, result.output
    assert "rollout 14,15" in result.stdout
    assert "env 4-7 (4)" in result.stdout


def test_a_process_owning_several_gpus_shows_its_tensor_parallel_size(tmp_path: Path) -> None:
    conf = write(
        tmp_path, "cluster:\n  num_nodes: 1\n  component_placement:\n    actor: 0-3\n    rollout: 4-7:0-1\n"
    )
    result = invoke(conf, "--nodes", "1x8")
    assert result.exit_code == 0, result.output
    words = " ".join(result.stdout.split())  # a title longer than its table wraps
    assert "2 processes (GPU, 2 per process: tensor_parallel_size=2)" in words
    assert "4 processes (GPU) " in words  # one device each: nothing to shard


def test_a_components_checkpoint_is_shown_with_its_architecture_and_parameter_count(tmp_path: Path) -> None:
    """Read from config.json alone: the weights are deleted first, and a 70B config is counted."""
    from transformers import AutoModelForCausalLM

    from tests.engines.tiny_models import make_checkpoint

    tied = make_checkpoint("qwen2_tied", tmp_path / "qwen")
    expected = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tied).parameters())
    for weights in tied.glob("*.safetensors"):
        weights.unlink()
    big = tmp_path / "llama70b"
    big.mkdir()
    (big / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
        "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "vocab_size": 128256,
    }))  # fmt: skip
    conf = write(
        tmp_path,
        "cluster:\n  num_nodes: 1\n  component_placement:\n"
        f"    actor: {{placement: 0-3, model: {big}}}\n"
        f"    rollout: {{placement: '4-7:0-1', model: {tied}}}\n"
        f"    reward: {{placement: 0, model: {tmp_path / 'elsewhere'}}}\n",
    )
    result = invoke(conf, "--nodes", "1x8")
    assert result.exit_code == 0, result.output
    words = " ".join(result.stdout.split())
    assert "tensor_parallel_size=2) · Qwen2ForCausalLM, " in words
    assert f"{expected / 1e3:.2f}K parameters" in words
    assert "4 processes (GPU) · LlamaForCausalLM, 70.55B parameters" in words
    assert f"{tmp_path / 'elsewhere'}: no config.json on this machine" in words
    plan = json.loads(invoke(conf, "--nodes", "1x8", "--json").stdout)
    assert plan["components"]["rollout"]["model"] == {
        "path": str(tied),
        "architecture": "Qwen2ForCausalLM",
        "parameters": expected,
    }
    assert plan["components"]["actor"]["model"]["parameters"] == 70_553_706_496


def test_a_components_checkpoint_must_be_a_path(tmp_path: Path) -> None:
    conf = write(
        tmp_path, "cluster:\n  num_nodes: 1\n  component_placement:\n    actor: {placement: 0, model: 7}\n"
    )
    assert_user_error(
        invoke(conf, "--nodes", "1x1"), "cluster.component_placement.actor.model", "checkpoint path"
    )


def test_the_map_shows_every_unit_a_process_drives(tmp_path: Path) -> None:
    conf = write(
        tmp_path,
        """\
cluster:
  num_nodes: 1
  component_placement:
    env: {node_group: cams, placement: "0-1:0"}
  node_groups:
    - label: cams
      node_ranks: 0
      hardware: {type: cam, configs: [{node_rank: 0, serial: a}, {node_rank: 0, serial: b}]}
""",
    )
    result = invoke(conf, "--nodes", "1x0")
    assert result.exit_code == 0, result.output
    assert "cam0: env 0" in result.stdout and "cam1: env 0" in result.stdout


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda path: path.stem)
def test_every_example_plans(example: Path) -> None:
    assert invoke(example).exit_code == 0
    assert invoke(example, "--json").exit_code == 0


def test_svg_is_written(tmp_path: Path) -> None:
    target = tmp_path / "map.svg"
    result = invoke(EXAMPLES / "disaggregated.yaml", "--json", "--svg", target)
    assert result.exit_code == 0, result.output
    assert target.read_text().startswith("<svg")
    assert str(target) in result.stderr
    json.loads(result.stdout)  # the note about the SVG stays off stdout


def test_unwritable_svg_path_fails_before_any_output(tmp_path: Path) -> None:
    result = invoke(EXAMPLES / "colocated.yaml", "--json", "--svg", tmp_path / "missing" / "map.svg")
    assert_user_error(result, "cannot write the SVG")


def test_large_plan_is_truncated_and_fast(tmp_path: Path) -> None:
    config = write(tmp_path, "cluster:\n  num_nodes: 1000\n  component_placement:\n    actor: all\n")
    started = time.perf_counter()
    result = invoke(config, "--nodes", "1000x8")
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    assert "… 7980 more" in result.stdout
    assert "first 32 of 1000 nodes" in result.stdout
    assert "actor 255" in result.stdout and "actor 256" not in result.stdout
    assert len(result.stdout.splitlines()) < 150
    assert elapsed < 5


def test_all_shows_every_rank(tmp_path: Path) -> None:
    config = write(tmp_path, "cluster:\n  num_nodes: 40\n  component_placement:\n    actor: all\n")
    result = invoke(config, "--nodes", "40x1", "--all")
    assert result.exit_code == 0, result.output
    assert "more" not in result.stdout
    assert "actor 39" in result.stdout


def test_nodes_option_overrides_simulate() -> None:
    result = invoke(EXAMPLES / "colocated.yaml", "--nodes", "4", "--json")
    assert_user_error(result, "GPU rank 7 does not exist")  # one node with 4 GPUs, not simulate's 8
    result = invoke(EXAMPLES / "cpu_only.yaml", "--nodes", "8,8,4", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["cluster"]["nodes"] == [8, 8, 4]


# --- user errors: exit 2, a message, no traceback ----------------------------------------------------


def test_bad_placement_string_shows_a_caret(tmp_path: Path) -> None:
    config = write(tmp_path, "cluster:\n  num_nodes: 1\n  component_placement:\n    actor: 0-3:0-5\n")
    result = invoke(config, "--nodes", "1x8")
    assert_user_error(result, "component 'actor'", "0-3:0-5")
    assert any(line.strip() and set(line.strip()) == {"^"} for line in result.stderr.splitlines())


def test_missing_file(tmp_path: Path) -> None:
    assert_user_error(invoke(tmp_path / "nope.yaml"), "no such file")


def test_config_without_cluster(tmp_path: Path) -> None:
    assert_user_error(invoke(write(tmp_path, "actor: 0-7\n")), "no 'cluster' section")


@pytest.mark.parametrize("spec", ["2y8", "8,,8", "0x8", "abc"])
def test_bad_nodes_spec(spec: str) -> None:
    assert_user_error(invoke(EXAMPLES / "colocated.yaml", "--nodes", spec), "--nodes")


def test_node_count_mismatch() -> None:
    result = invoke(EXAMPLES / "disaggregated.yaml", "--nodes", "3x8")
    assert_user_error(result, "3 nodes given", "cluster.num_nodes is 2")


def test_simulate_count_mismatch(tmp_path: Path) -> None:
    config = write(
        tmp_path, "cluster:\n  num_nodes: 2\n  simulate: [8]\n  component_placement:\n    actor: 0-7\n"
    )
    assert_user_error(invoke(config), "cluster.simulate", "1 node given")


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    config = write(tmp_path, "cluster:\n  num_nodes: 1\n   component_placement: 0-7\n")
    assert_user_error(invoke(config), "YAML syntax error at line 3", "^")


def test_unknown_node_group(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        "cluster:\n  num_nodes: 1\n  component_placement:\n    actor:\n      node_group: gpu\n"
        "      placement: 0-7\n",
    )
    assert_user_error(invoke(config), "unknown node group 'gpu'")


def test_console_script_reports_errors_without_traceback(tmp_path: Path) -> None:
    """The installed entry point, not just the typer app, exits 2 cleanly."""
    result = subprocess.run(
        [sys.executable, "-m", "rlinfra.cli.main", "plan", str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": ""},
        check=False,
    )
    assert result.returncode == 2
    assert "no such file" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


# --- helpers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([0], "0"),
        ([0, 1], "0,1"),
        ([3, 7], "3,7"),
        (list(range(101)), "0-100 (101)"),
        ([0, 1, 2, 5], "0-2,5 (4)"),
        ([0, 2, 4, 6, 8], "0,2,4,… (5)"),
    ],
)
def test_format_ranks(ranks: list[int], text: str) -> None:
    assert format_ranks(ranks) == text


def test_labels_are_printed_literally_not_as_markup(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        "cluster:\n  num_nodes: 1\n  component_placement:\n    '[bold]actor':\n      node_group: '[red]x'\n"
        "      placement: 0-1\n  node_groups:\n    - label: '[red]x'\n      node_ranks: 0\n",
    )
    result = invoke(config, "--nodes", "1x2")
    assert result.exit_code == 0, result.output
    assert "[red]x" in result.stdout
    assert "[bold]actor 1" in result.stdout


def test_unquoted_colon_placement_is_not_read_as_a_base_60_number(tmp_path: Path) -> None:
    # YAML 1.1 reads `1:0` as 60; rlinfra's loader keeps it the string the user wrote.
    config = write(tmp_path, "cluster:\n  num_nodes: 8\n  component_placement:\n    actor: 1:0\n")
    result = invoke(config, "--nodes", "8x8", "--json")
    assert result.exit_code == 0, result.output
    actor = json.loads(result.stdout)["components"]["actor"]
    assert actor["placement"] == "1:0"
    assert actor["placements"][0]["hardware_ranks"] == [1]


def test_absurd_accelerator_count_is_refused(tmp_path: Path) -> None:
    config = write(tmp_path, "cluster:\n  num_nodes: 1\n  component_placement:\n    actor: 0\n")
    assert_user_error(invoke(config, "--nodes", "1x100000000"), "at most 1,024 accelerators per node")


def test_an_overfull_memory_plan_exits_2_or_only_warns_with_memory_check_warn(tmp_path):
    colocated = (EXAMPLES.parent / "memory" / "qwen2.5-7b-grpo-colocated.yaml").read_text()
    overfull = colocated.replace("time_shared: true", "time_shared: false")  # everything at once
    assert_user_error(invoke(write(tmp_path, overfull)), "phase 'all' needs", "gpu_memory_utilization <= ")
    warned = invoke(
        write(tmp_path, overfull.replace("  accelerator: H100", "  accelerator: H100\n  memory_check: warn"))
    )
    assert warned.exit_code == 0 and "Memory per device" in warned.stdout
    assert "warning: cluster.component_placement: node 0 devices 0-7: phase 'all' needs" in warned.stderr
