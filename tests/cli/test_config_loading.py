"""Reading RLinf's configs as they are: only ``cluster`` resolved, Hydra defaults lists composed.

The configs under ``rlinf_style_configs/`` are written in the shapes of RLinf's documented
examples (not copied from RLinf): Hydra config directories whose files use, outside ``cluster``,
what rlinfra cannot resolve on its own — unset environment variables, RLinf's resolvers
(``subtract``, ``not``) and keys that exist only after composition.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from typer.testing import CliRunner

from rlinfra.cli.main import app
from rlinfra.config.loading import ConfigError, load_cluster_config, load_config

pytestmark = pytest.mark.timeout(60)

CONFIGS = Path(__file__).resolve().parent / "rlinf_style_configs"
EMBODIED = CONFIGS / "embodied"
PPO = EMBODIED / "maniskill_ppo_openvla.yaml"
FRANKA = EMBODIED / "realworld_franka_ppo.yaml"
MATH = CONFIGS / "math"
GRPO = "qwen2.5-1.5b-grpo"
ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
SEEN: dict = {}


@pytest.fixture(autouse=True)
def _no_rlinf_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables RLinf's launch scripts export are unset here, as on a laptop doing a dry run."""
    for name in ("EMBODIED_PATH", "MODEL_DIR", "MANISKILL_ASSET_DIR", "RLINF_OUTPUT_DIR"):
        monkeypatch.delenv(name, raising=False)


def invoke(*args: str | Path):
    return CliRunner().invoke(app, list(map(str, args)), env=ENV)


def plan_json(*args: str | Path) -> dict:
    result = invoke("plan", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def world_sizes(plan: dict) -> dict[str, int]:
    return {name: component["world_size"] for name, component in plan["components"].items()}


def assert_user_error(result, *fragments: str) -> None:
    """Exit 2, one message on stderr, nothing on stdout, and no traceback anywhere."""
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    for fragment in fragments:
        assert fragment in result.stderr


def embodied_copy(tmp_path: Path, primary: str) -> Path:
    """The embodied config directory with one more primary config, ``job.yaml``."""
    directory = tmp_path / "config"
    shutil.copytree(EMBODIED, directory)
    (directory / "job.yaml").write_text(primary)
    return directory / "job.yaml"


def composed_job(actor: str) -> str:
    return (
        "defaults:\n  - env/maniskill_put_on_plate@env.train\n  - model/openvla@actor.model\n  - _self_\n"
        "hydra:\n  searchpath:\n    - file://${oc.env:EMBODIED_PATH}/config/\n"
        f"cluster:\n  num_nodes: 1\n  component_placement:\n    actor: {actor}\n"
        "runner:\n  output_dir: ${oc.env:EMBODIED_PATH}/results\n"
    )


# --- RLinf's configs plan as they are -------------------------------------------------------------


def test_an_embodied_config_is_composed_from_its_file() -> None:
    plan = plan_json(PPO, "--nodes", "1x8")
    assert world_sizes(plan) == {"actor": 4, "env": 2, "rollout": 2}
    env = plan["components"]["env"]["placements"]
    assert [record["local_hardware_ranks"] for record in env] == [[4], [5]]


@pytest.mark.parametrize("name", [GRPO, f"{GRPO}.yaml"])
def test_a_config_directory_and_a_config_name(name: str) -> None:
    plan = plan_json(MATH, "--config-name", name, "--nodes", "1x8")
    assert world_sizes(plan) == {"actor": 8, "rollout": 8, "reward": 8}
    assert {component["placement"] for component in plan["components"].values()} == {"all"}
    rollout = plan["components"]["rollout"]["placements"]
    assert [record["local_hardware_ranks"] for record in rollout] == [[device] for device in range(8)]


def test_heterogeneous_node_groups() -> None:
    plan = plan_json(FRANKA, "--nodes", "8,4,0")
    assert world_sizes(plan) == {"actor": 8, "rollout": 8, "env": 2}
    rollout = plan["components"]["rollout"]["placements"]
    assert [(r["cluster_node_rank"], r["local_hardware_ranks"]) for r in rollout[:3]] == [
        (1, [0]),
        (1, [0]),
        (1, [1]),
    ]
    env = plan["components"]["env"]["placements"]
    assert [(r["cluster_node_rank"], r["hardware_type"], r["local_hardware_ranks"]) for r in env] == [
        (2, "Franka", [0]),
        (2, "Franka", [1]),
    ]


@pytest.mark.parametrize(("path", "config_name"), [(PPO, None), (FRANKA, None), (MATH, GRPO)])
def test_only_the_cluster_is_resolved(path: Path, config_name: str | None) -> None:
    with pytest.raises(ConfigError, match="cannot resolve"):
        load_config(path, config_name)  # the rest of the file really does not resolve here
    assert list(load_cluster_config(path, config_name)) == ["cluster"]


def test_a_single_file_with_unresolvable_values_outside_the_cluster(tmp_path: Path) -> None:
    config = tmp_path / "conf.yaml"
    config.write_text(
        "cluster:\n  num_nodes: 1\n  component_placement:\n    actor: 0-1\n"
        "runner:\n  a: ${oc.env:RLINFRA_TEST_UNSET}\n  b: ${subtract:1,2}\n  c: ${no.such.key}\n  d: ???\n"
    )
    assert world_sizes(plan_json(config, "--nodes", "1x2")) == {"actor": 2}


def test_an_interpolation_in_the_cluster_may_point_outside_it() -> None:
    # cluster.num_nodes is ${runner.num_nodes}, which is 1: two nodes must disagree with it.
    result = invoke("plan", MATH, "--config-name", GRPO, "--nodes", "2x8")
    assert_user_error(result, "2 nodes given, but cluster.num_nodes is 1")


def test_an_interpolation_in_the_cluster_may_point_into_a_sub_config(tmp_path: Path) -> None:
    job = embodied_copy(tmp_path, composed_job("0-${env.train.max_episode_steps}"))
    plan = plan_json(job, "--nodes", "1x81")
    assert world_sizes(plan) == {"actor": 81}  # max_episode_steps: 80 in env/maniskill_put_on_plate


# --- what cannot be resolved inside the cluster -----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "problem", "expected"),
    [
        (
            "${oc.env:RLINFRA_TEST_UNSET_GPUS}",
            "Environment variable 'RLINFRA_TEST_UNSET_GPUS' not found",
            "needs NAME set",
        ),
        ("${runner.actor_gpus}", "Interpolation key 'runner.actor_gpus' not found", "a key that exists"),
        ("${subtract:8,1}", "Unsupported interpolation type subtract", "only OmegaConf's built-in resolvers"),
        ("???", "Missing mandatory value: cluster.component_placement.actor", "a value instead of '???'"),
    ],
)
def test_a_broken_value_inside_the_cluster_is_named(
    tmp_path: Path, value: str, problem: str, expected: str
) -> None:
    job = embodied_copy(tmp_path, composed_job(f"'{value}'"))
    result = invoke("plan", job, "--nodes", "1x8")
    assert_user_error(result, f"{job} (composed by Hydra)", "cluster.component_placement.actor", value)
    assert f"{problem}; expected " in result.stderr
    assert expected in result.stderr


def test_a_cluster_value_whose_target_is_broken_is_named(tmp_path: Path) -> None:
    config = tmp_path / "conf.yaml"
    config.write_text(
        "cluster:\n  num_nodes: ${runner.nodes}\n  component_placement:\n    actor: 0\n"
        "runner:\n  nodes: ${oc.env:RLINFRA_TEST_UNSET_NODES}\n"
    )
    result = invoke("plan", config)
    assert_user_error(result, "cluster.num_nodes", "'${runner.nodes}'", "RLINFRA_TEST_UNSET_NODES")


# --- Hydra composition ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("defaults", "fragments"),
    [
        ("  - env/no_such_env@env.train\n", ["Could not load 'env/no_such_env'", "searched: "]),
        ("  - {env: maniskill_put_on_plate, model: openvla}\n", ["Too many keys in default item"]),
        (
            "  - override hydra/job_logging: loud\n",
            ["Could not find 'hydra/job_logging/loud'", "available: "],
        ),
    ],
)
def test_a_defaults_list_that_cannot_be_composed(tmp_path: Path, defaults: str, fragments: list[str]) -> None:
    job = embodied_copy(tmp_path, "defaults:\n" + defaults + "cluster:\n  num_nodes: 1\n")
    result = invoke("plan", job)
    assert_user_error(result, f"{job}: cannot compose the Hydra config: ", *fragments)
    assert len(result.stderr.strip().splitlines()) == 1


def test_defaults_that_are_not_a_list(tmp_path: Path) -> None:
    config = tmp_path / "conf.yaml"
    config.write_text("defaults: 5\ncluster:\n  num_nodes: 1\n")
    assert_user_error(invoke("plan", config), "defaults must be a list (got int)")


def test_a_yaml_error_in_a_sub_config_names_that_file(tmp_path: Path) -> None:
    job = embodied_copy(tmp_path, composed_job("0"))
    broken = job.parent / "model" / "openvla.yaml"
    broken.write_text("model_type: openvla\naction_dim: [7\n")
    assert_user_error(invoke("plan", job), f"{broken}: YAML syntax error at line", "^")


def test_a_default_found_only_through_the_searchpath(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared dir's"  # a space and a quote: the searchpath override must quote them
    (shared / "config" / "env").mkdir(parents=True)
    (shared / "config" / "env" / "shared_env.yaml").write_text("num_envs: 4\n")
    primary = tmp_path / "app" / "job.yaml"
    primary.parent.mkdir()
    primary.write_text(
        "defaults:\n  - env/shared_env@env.train\n  - _self_\n"
        "hydra:\n  searchpath:\n    - file://${oc.env:RLINFRA_TEST_SHARED}/config/\n"
        "    - file://${oc.env:RLINFRA_TEST_UNSET_DIR}/config/\n"
        "cluster:\n  num_nodes: 1\n  component_placement:\n    actor: 0\n"
    )
    assert_user_error(
        invoke("plan", primary),
        "Could not load 'env/shared_env'",
        "Skipped hydra.searchpath entries that do not resolve",
        "Environment variable 'RLINFRA_TEST_SHARED' not found",
    )
    monkeypatch.setenv("RLINFRA_TEST_SHARED", str(shared))
    assert world_sizes(plan_json(primary, "--nodes", "1x1")) == {"actor": 1}
    assert load_config(primary).env.train.num_envs == 4


def test_hydra_global_state_is_cleaned_up(tmp_path: Path) -> None:
    load_cluster_config(PPO)
    assert not GlobalHydra.instance().is_initialized()
    job = embodied_copy(tmp_path, "defaults:\n  - env/no_such_env\ncluster:\n  num_nodes: 1\n")
    with pytest.raises(ConfigError):
        load_cluster_config(job)
    assert not GlobalHydra.instance().is_initialized()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((MATH,), "not a file. Pass the path of a YAML config"),
        ((PPO, "--config-name", GRPO), "not a directory. With --config-name"),
        ((MATH, "--config-name", "no-such-config"), "no-such-config.yaml: no such file"),
    ],
)
def test_directory_and_config_name_mistakes(args: tuple, fragment: str) -> None:
    assert_user_error(invoke("plan", *args), fragment)


# --- YAML 1.1's base-60 numbers ---------------------------------------------------------------------


def test_composed_files_keep_unquoted_colon_values(tmp_path: Path) -> None:
    """Hydra reads files with OmegaConf's YAML 1.1 loader, where `1:0` is 60; not here."""
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "robot.yaml").write_text("reset_every: 1:30\n")
    job = tmp_path / "job.yaml"
    job.write_text(
        "defaults:\n  - env/robot@env.train\n  - _self_\n"
        "cluster:\n  num_nodes: 1\n  component_placement:\n    actor: 1:0\n"
    )
    actor = plan_json(job, "--nodes", "1x8")["components"]["actor"]
    assert (actor["placement"], actor["placements"][0]["local_hardware_ranks"]) == ("1:0", [1])
    assert load_config(job).env.train.reset_every == "1:30"


def test_the_base_60_guard_is_scoped_to_composition(tmp_path: Path) -> None:
    load_cluster_config(PPO)
    plain = tmp_path / "plain.yaml"
    plain.write_text("placement: 1:0\n")
    assert OmegaConf.load(plain).placement == 60  # OmegaConf (and plain Hydra) still read base 60


# --- run, slurm and job ---------------------------------------------------------------------------


def record_job(cfg, *, resume: bool = False) -> int:
    SEEN.update(model_path=cfg.actor.model.path, precision=cfg.rollout.precision, added=cfg.algo.added)
    return 0


def test_run_composes_and_resolves_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "tiny.yaml").write_text(
        "path: ${oc.env:RLINFRA_TEST_MODEL_DIR}/tiny\nprecision: bf16\n"
    )
    (tmp_path / "job.yaml").write_text(
        "defaults:\n  - model/tiny@actor.model\n  - _self_\n"
        "run:\n  entrypoint: tests.cli.test_config_loading:record_job\n"
        "cluster:\n  num_nodes: 1\n  component_placement:\n    actor: 0\n"
        "rollout:\n  precision: ${actor.model.precision}\nalgo:\n  lr: 0.1\n"
    )
    monkeypatch.setenv("RLINFRA_TEST_MODEL_DIR", "/models")
    SEEN.clear()
    result = invoke("run", tmp_path / "job.yaml", "algo.added=3")  # a new key: not Hydra's struct mode
    assert result.exit_code == 0, result.output
    assert SEEN == {"model_path": "/models/tiny", "precision": "bf16", "added": 3}


def test_run_names_what_does_not_resolve() -> None:
    assert_user_error(invoke("run", PPO), "cannot resolve", "(composed by Hydra)")


def test_slurm_render_reads_only_the_cluster() -> None:
    result = invoke("slurm", "render", FRANKA, "--gpus-per-node", "8", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    assert "#SBATCH --nodes=3" in result.stdout


def test_job_sections_are_resolved_with_the_cluster(tmp_path: Path) -> None:
    config = tmp_path / "conf.yaml"
    config.write_text(
        "cluster:\n  num_nodes: 1\n  component_placement:\n    actor: 0\n"
        "runtime_env:\n  env_vars:\n    SEED: ${runner.seed}\n"
        "runner:\n  seed: 7\n  logs: ${oc.env:RLINFRA_TEST_UNSET}\n"
    )
    cfg = load_cluster_config(config, also=("runtime_env", "absent"))
    assert list(cfg) == ["cluster", "runtime_env"]
    assert cfg.runtime_env.env_vars.SEED == 7
