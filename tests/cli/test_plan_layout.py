"""``rlinfra plan``'s layout: the job's one placement group, slices, reservations, relations."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rlinfra.cli.main import app
from rlinfra.placement.errors import short_ranks
from rlinfra.views.layout_view import reservations_text

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "placement"
COLOCATED = EXAMPLES / "colocated.yaml"
DISAGGREGATED = EXAMPLES / "disaggregated.yaml"
MIXED = EXAMPLES / "mixed.yaml"
ENV = {"COLUMNS": "200", "NO_COLOR": "1"}


def invoke(*args: str | Path):
    return CliRunner().invoke(app, ["plan", *map(str, args)], env=ENV)


def layout_of(*args: str | Path) -> dict[str, Any]:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["layout"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "conf.yaml"
    path.write_text(text)
    return path


def config_with(components: dict[str, str], num_nodes: int = 1) -> str:
    lines = "".join(f"    {name}: {placement!r}\n" for name, placement in components.items())
    return f"cluster:\n  num_nodes: {num_nodes}\n  component_placement:\n{lines}"


def gpu_shares(layout: dict[str, Any], name: str) -> list[float]:
    return [row["num_gpus"] for row in layout["components"][name]["reservations"]]


# --- JSON ----------------------------------------------------------------------------------------


def test_colocated_components_share_every_bundle() -> None:
    layout = layout_of(COLOCATED)
    assert layout["relations"] == [{"a": "actor", "b": "rollout", "relation": "colocated"}]
    assert [bundle["devices"] for bundle in layout["bundles"]] == [[device] for device in range(8)]
    assert all(bundle["node"] == 0 for bundle in layout["bundles"])
    assert layout["bundles"][0]["resources"] == {"CPU": 1.0, "GPU": 1.0}  # one CPU per GPU, shared
    for name in ("actor", "rollout"):
        component = layout["components"][name]
        assert component["slices"] == [[0, 8]]
        assert gpu_shares(layout, name) == [0.5] * 8
        assert [row["bundle_index"] for row in component["reservations"]] == list(range(8))


def test_disaggregated_components_use_disjoint_bundles() -> None:
    layout = layout_of(DISAGGREGATED)
    relations = {(r["a"], r["b"]): r["relation"] for r in layout["relations"]}
    assert relations == {
        ("actor", "rollout"): "disaggregated",
        ("actor", "env"): "disaggregated",
        ("rollout", "env"): "disaggregated",
    }
    components = layout["components"]
    assert components["actor"]["slices"] == [[0, 8]]
    assert gpu_shares(layout, "actor") == [1.0] * 8
    assert components["rollout"]["slices"] == [[9, 8]]
    assert gpu_shares(layout, "rollout") == [0.5] * 16  # two processes per GPU
    # env runs on whole nodes: each node's CPU bundle, after that node's GPU bundles
    assert components["env"]["slices"] == [[8, 1], [17, 1]]
    env_bundles = [layout["bundles"][index] for index in (8, 17)]
    assert [(b["node"], b["devices"], b["resources"]) for b in env_bundles] == [
        (0, [], {"CPU": 1.0}),  # one CPU per node, shared by the node's four env processes
        (1, [], {"CPU": 1.0}),
    ]
    assert all((row["num_gpus"], row["resources"]) == (0.0, {}) for row in components["env"]["reservations"])


def test_mixed_layout_is_partly_colocated() -> None:
    layout = layout_of(MIXED)
    assert layout["relations"] == [{"a": "actor", "b": "rollout", "relation": "partly colocated"}]
    assert layout["components"]["actor"]["slices"] == [[0, 8]]
    assert layout["components"]["rollout"]["slices"] == [[0, 4], [8, 8]]
    assert gpu_shares(layout, "actor") == [0.5] * 4 + [1.0] * 4
    assert gpu_shares(layout, "rollout") == [0.5] * 4 + [1.0] * 8


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda path: path.stem)
def test_layout_schema_and_consistency(example: Path) -> None:
    """Every example: the documented keys, one reservation per process, and bundles that hold what
    their processes reserve."""
    result = invoke(example, "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    layout = plan["layout"]
    assert set(layout) == {"bundles", "components", "relations"}
    bundles = layout["bundles"]
    assert [bundle["index"] for bundle in bundles] == list(range(len(bundles)))
    for bundle in bundles:
        assert set(bundle) == {"index", "node", "devices", "resources"}
        assert bundle["resources"]["CPU"] > 0
    # (node rank, device id) order; a node's CPU bundle after its device bundles
    order = [(b["node"], not b["devices"], b["devices"]) for b in bundles]
    assert order == sorted(order)

    assert list(layout["components"]) == list(plan["components"])
    used: dict[int, dict[str, float]] = {}
    for name, component in layout["components"].items():
        assert set(component) == {"slices", "reservations"}
        rows = component["reservations"]
        assert len(rows) == plan["components"][name]["world_size"]
        indices = sorted({row["bundle_index"] for row in rows})
        covered = [i for offset, length in component["slices"] for i in range(offset, offset + length)]
        assert covered == indices
        for row, record in zip(rows, plan["components"][name]["placements"], strict=True):
            assert set(row) == {"bundle_index", "num_cpus", "num_gpus", "resources"}
            assert bundles[row["bundle_index"]]["node"] == record["cluster_node_rank"]
            total = used.setdefault(row["bundle_index"], {})
            total["CPU"] = total.get("CPU", 0.0) + row["num_cpus"]
            total["GPU"] = total.get("GPU", 0.0) + row["num_gpus"]
            for key, amount in row["resources"].items():
                total[key] = total.get(key, 0.0) + amount
    for index, total in used.items():
        for key, amount in total.items():
            assert amount <= bundles[index]["resources"].get(key, 0.0) + 1e-3, (index, key)

    names = list(plan["components"])
    pairs = [(first, second) for i, first in enumerate(names) for second in names[i + 1 :]]
    assert [(r["a"], r["b"]) for r in layout["relations"]] == pairs
    assert {r["relation"] for r in layout["relations"]} <= {"colocated", "disaggregated", "partly colocated"}


def test_json_layout_matches_the_runtime_planner() -> None:
    """The CLI shows exactly what a live ``Layout`` would reserve."""
    from omegaconf import OmegaConf

    from rlinfra.placement import ClusterSpec, ComponentPlacement
    from rlinfra.runtime.bundles import plan_layout

    cfg = OmegaConf.load(DISAGGREGATED)
    placement = ComponentPlacement(cfg, ClusterSpec.from_config(cfg.cluster, [8, 8]))
    plan = plan_layout({name: placement.get_placements(name) for name in placement.components})
    layout = layout_of(DISAGGREGATED)
    assert [bundle["resources"] for bundle in layout["bundles"]] == plan.bundles
    for name in placement.components:
        rows = layout["components"][name]["reservations"]
        expected = plan.reservations[name]
        assert [(r["bundle_index"], r["num_cpus"], r["num_gpus"], r["resources"]) for r in rows] == [
            (r.bundle_index, r.num_cpus, r.num_gpus, dict(r.resources)) for r in expected
        ]


# --- human output ------------------------------------------------------------------------------------


def test_human_layout_of_the_colocated_example() -> None:
    result = invoke(COLOCATED)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.index("Node × device map") < out.index("Layout (one placement group, 8 bundles)")
    assert "node 0: GPU 0-7" in out
    assert out.count("GPU 0.5, CPU 0.5") == 2  # actor and rollout rows
    assert "reserves GPU 8, CPU 8 on 1 node" in out
    assert "Relations" in out
    assert "actor ↔ rollout: colocated (one config key)" in out


def test_human_layout_of_the_disaggregated_example() -> None:
    result = invoke(DISAGGREGATED)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Layout (one placement group, 18 bundles)" in out
    assert "node 0-1 (whole node)" in out
    assert "8,17" in out and "9-16" in out
    assert "GPU 0.5, CPU 0.5" in out and "GPU 1, CPU 1" in out
    for pair in ("actor ↔ rollout", "actor ↔ env", "rollout ↔ env"):
        assert f"{pair}: disaggregated" in out
    assert "one config key" not in out


def test_human_layout_of_the_mixed_example() -> None:
    result = invoke(MIXED)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "0-3,8-15" in out
    assert "node 1: GPU 0-7" in out
    assert "GPU 0.5, CPU 0.5 (4)" in out and "GPU 1, CPU 1 (8)" in out
    assert "actor ↔ rollout: partly colocated" in out


def test_custom_hardware_note() -> None:
    result = invoke(EXAMPLES / "seed_node_groups.yaml")
    assert result.exit_code == 0, result.output
    assert "node 4-5: robot 0-1" in result.stdout
    assert "for robot, only CPUs" in result.stdout


def test_single_component_has_no_relations(tmp_path: Path) -> None:
    result = invoke(EXAMPLES / "cpu_only.yaml")
    assert result.exit_code == 0, result.output
    assert "Layout (one placement group, 3 bundles)" in result.stdout
    assert "Relations" not in result.stdout
    assert layout_of(EXAMPLES / "cpu_only.yaml")["relations"] == []


def test_many_components_are_capped(tmp_path: Path) -> None:
    config = write(tmp_path, config_with({f"c{index}": str(index) for index in range(40)}))
    result = invoke(config, "--nodes", "1x40")
    assert result.exit_code == 0, result.output
    out = result.stdout[result.stdout.index("Layout (") :]
    assert "c31" in out and "c32 " not in out and "… 8 more" in out
    assert "c10 ↔ c11: disaggregated" in out and "c11 ↔ c12" not in out
    assert "… 714 more pairs among 40 components" in out  # 780 pairs, 66 among the first 12

    everything = invoke(config, "--nodes", "1x40", "--all")
    assert everything.exit_code == 0, everything.output
    assert "c38 ↔ c39: disaggregated" in everything.stdout
    assert "more pairs" not in everything.stdout
    assert len(layout_of(config, "--nodes", "1x40")["relations"]) == 780


# --- errors, speed, no Ray ---------------------------------------------------------------------------


def test_a_share_above_one_reserves_its_whole_part(tmp_path: Path) -> None:
    """actor rank 0 uses GPUs 0-1, GPU 0 shared with rollout: 1/2 + 1 = 1.5 GPUs, which Ray cannot
    reserve; it asks 1, and the bundle holds both GPUs whole."""
    config = write(tmp_path, config_with({"actor": "0-1:0", "rollout": "0:0"}))
    layout = layout_of(config, "--nodes", "1x8")
    assert gpu_shares(layout, "actor") == [1.0]
    assert gpu_shares(layout, "rollout") == [0.5]
    assert layout["bundles"][0]["resources"]["GPU"] == 2.0


CONFLICTING_LABELS = """\
cluster:
  num_nodes: 1
  component_placement:
    a: {placement: "0", constraints: {labels: {zone: east}}}
    b: {placement: "0", constraints: {labels: {zone: west}}}
"""


def test_a_layout_no_node_can_hold_is_a_user_error(tmp_path: Path) -> None:
    """Two components sharing GPU 0 need different values of one node label."""
    result = invoke(write(tmp_path, CONFLICTING_LABELS), "--nodes", "1x8")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.output
    assert "cannot lay the job out as one placement group" in result.stderr
    assert "no node carries both" in result.stderr


def test_layout_error_comes_before_writing_an_svg(tmp_path: Path) -> None:
    result = invoke(write(tmp_path, CONFLICTING_LABELS), "--nodes", "1x8", "--svg", tmp_path / "map.svg")
    assert result.exit_code == 2
    assert not (tmp_path / "map.svg").exists()


def test_large_layout_is_fast_and_compact(tmp_path: Path) -> None:
    config = write(tmp_path, config_with({"actor": "all"}, num_nodes=1000))
    started = time.perf_counter()
    result = invoke(config, "--nodes", "1000x8", "--json")
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    layout = json.loads(result.stdout)["layout"]
    assert len(layout["bundles"]) == 8000
    assert layout["components"]["actor"]["slices"] == [[0, 8000]]
    assert elapsed < 2

    started = time.perf_counter()
    result = invoke(config, "--nodes", "1000x8")
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    assert "Layout (one placement group, 8000 bundles)" in result.stdout
    assert "node 0-999: GPU 0-7" in result.stdout
    assert elapsed < 2


def test_plan_does_not_import_ray() -> None:
    """The plan command reads the pure layout table and must not pull in Ray or the runtime."""
    script = textwrap.dedent(
        f"""
        import json, sys
        from typer.testing import CliRunner
        import rlinfra.cli.plan
        from rlinfra.cli.main import app
        for args in (["--json"], []):
            result = CliRunner().invoke(app, ["plan", {str(MIXED)!r}, *args])
            assert result.exit_code == 0, result.output
        assert json.loads(CliRunner().invoke(app, ["plan", {str(MIXED)!r}, "--json"]).stdout)["layout"]
        loaded = sorted(name for name in sys.modules if name == "ray" or name.startswith("ray."))
        assert not loaded, loaded
        assert "rlinfra.runtime.cluster" not in sys.modules
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr


# --- helpers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bundles", "text"),
    [
        (list(range(8)), "0-7"),
        ([5], "5"),
        ([0, 1, 2, 3, 8, 9, 10, 11], "0-3,8-11"),
        ([8, 17], "8,17"),
        ([0, 2, 4, 6, 8, 9], "0,2,4,6,… (6 bundles)"),
    ],
)
def test_bundle_runs(bundles: list[int], text: str) -> None:
    """The layout table's bundles cell: runs of bundle indices, the first four and a count."""
    assert short_ranks(bundles, limit=4, unit="bundles") == text


def test_reservations_text() -> None:
    from rlinfra.runtime.bundles import ActorReservation as reservation

    rows = [reservation(0, 1.0, 0.5), reservation(1, 1.0, 0.5), reservation(2, 1.0, 1.0)]
    assert reservations_text(rows[:2]) == "GPU 0.5, CPU 1"
    assert reservations_text(rows) == "GPU 0.5, CPU 1 (2)\nGPU 1, CPU 1 (1)"
    assert reservations_text([reservation(0, 0.5, 0.0, {"robot": 0.3333})]) == "robot 0.3333, CPU 0.5"


# --- what each node reserves ---------------------------------------------------------------------


SEED = EXAMPLES / "seed_node_groups.yaml"


def test_the_seed_example_fits_nodes_of_64_cpus() -> None:
    """512 agent processes share their nodes' CPUs: no node reserves more than 9 of 64."""
    result = invoke(SEED, "--cpus", "64", "--json")
    assert result.exit_code == 0, result.output
    nodes = json.loads(result.stdout)["nodes"]
    assert [row["fits"] for row in nodes] == [True] * 6
    cpus = [row["reserves"]["CPU"] for row in nodes]
    assert max(cpus) < 10  # was 164 on node 2 when every worker held a CPU
    assert cpus[2] == pytest.approx(8 + 156 * 0.0064)  # 8 rollout GPUs, 156 agents sharing one CPU
    assert sum(cpus) < 27


def test_a_node_that_cannot_hold_its_reservation_is_flagged(tmp_path: Path) -> None:
    agent = "      placement: 0-1:0-200,2-3:201-511\n"
    text = SEED.read_text().replace(agent, agent + "      num_cpus: 0.5\n")
    config = write(tmp_path, text)
    result = invoke(config, "--cpus", "64")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "no: short by CPU 22" in result.stdout  # node 2: 8 + 156 x 0.5 = 86 of 64
    assert "node(s) 2-3 reserve more CPUs than they have (node 2: CPU 86 of 64)" in result.stderr
    as_json = invoke(config, "--cpus", "64", "--json")
    assert [row["fits"] for row in json.loads(as_json.stdout)["nodes"]] == [
        True,
        True,
        False,
        False,
        True,
        True,
    ]


def test_simulated_clusters_are_checked_against_their_simulated_cpus(tmp_path: Path) -> None:
    text = textwrap.dedent(
        """\
        cluster:
          num_nodes: 1
          simulate: 1x2
          simulate_cpus: 1
          component_placement:
            a: 0-1
            b: {placement: 0-1, num_cpus: 1}
        """
    )
    result = invoke(write(tmp_path, text), "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["nodes"] == [
        {"node": 0, "reserves": {"CPU": 3.0, "GPU": 2.0}, "cpus": 1.0, "fits": False}
    ]


@pytest.mark.parametrize(
    ("spec", "problem"), [("lots", "cannot read 'lots'"), ("64,64", "2 CPU counts for 6 nodes")]
)
def test_bad_cpus_spec_is_a_usage_error(spec: str, problem: str) -> None:
    result = invoke(SEED, "--cpus", spec)
    assert result.exit_code == 2
    assert problem in result.stderr
    assert "Traceback" not in result.output
