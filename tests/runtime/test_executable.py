"""``python_interpreter_path``: the runtime_env, the node check, and real workers on a simulated
two-node Ray started under a marked interpreter."""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray

from rlinfra import Cluster, ComponentPlacement, Worker, WorkerGroupError
from rlinfra.placement import ClusterSpec, PlacementError
from rlinfra.runtime.executable import WorkerExecutable, worker_executable

MARK = "RLINFRA_INTERPRETER_MARK"


@dataclass(frozen=True)
class Paths:
    marked: Path  # a wrapper interpreter that sets MARK, then runs this Python
    missing: Path
    not_executable: Path
    without_ray: Path  # this Python without site-packages: no Ray


def executable_file(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> Paths:
    root = tmp_path_factory.mktemp("executables")
    not_executable = root / "python-without-x-bit"
    not_executable.write_text("#!/bin/sh\n")
    return Paths(
        marked=executable_file(
            root / "marked-python", f'#!/bin/sh\nexport {MARK}=1\nexec {sys.executable} "$@"\n'
        ),
        missing=root / "no-such-dir" / "python",
        not_executable=not_executable,
        without_ray=executable_file(
            root / "python-without-ray", f'#!/bin/sh\nexec {sys.executable} -S "$@"\n'
        ),
    )


def interpreter_group(label: str, node: int, path: Path) -> dict:
    return {
        "label": label,
        "node_ranks": node,
        "env_configs": [{"node_ranks": node, "python_interpreter_path": str(path)}],
    }


@pytest.fixture(scope="module")
def cfg(paths: Paths) -> dict:
    return {
        "cluster": {
            "num_nodes": 2,
            "simulate": "2x0",
            "simulate_cpus": 8,
            "node_groups": [
                interpreter_group("marked", 1, paths.marked),
                interpreter_group("missing", 1, paths.missing),
                interpreter_group("not_executable", 0, paths.not_executable),
                interpreter_group("without_ray", 1, paths.without_ray),
            ],
            "component_placement": {
                "plain": {"node_group": "node", "placement": "0-1"},
                "marked": {"node_group": "marked", "placement": "0"},
                "missing": {"node_group": "missing", "placement": "0"},
                "not_executable": {"node_group": "not_executable", "placement": "0"},
                "without_ray": {"node_group": "without_ray", "placement": "0"},
            },
        }
    }


@pytest.fixture(scope="module")
def cluster(cfg: dict) -> Iterator[Cluster]:
    with Cluster(cluster_cfg=cfg["cluster"]) as live:
        yield live


@pytest.fixture(scope="module")
def placement(cfg: dict, cluster: Cluster) -> ComponentPlacement:
    return ComponentPlacement(cfg, cluster)


class Probe(Worker):
    def facts(self) -> dict:
        return {
            "mark": os.environ.get(MARK),
            "pid": os.getpid(),
            "node": self._node_rank,
            "runtime_env": dict(ray.get_runtime_context().runtime_env),
        }


def launch(cluster: Cluster, placement: ComponentPlacement, name: str):
    return Probe.create_group().launch(cluster, placement.get_strategy(name), name=name, num_cpus=0.1)


def facts_of(cluster: Cluster, placement: ComponentPlacement, name: str) -> list[dict]:
    group = launch(cluster, placement, name)
    try:
        return group.facts().wait(timeout=60)
    finally:
        group.shutdown()


# --- python_interpreter_path, live -------------------------------------------------------------


def test_workers_on_the_group_nodes_run_under_the_interpreter_and_no_others(
    cluster: Cluster, placement: ComponentPlacement, paths: Paths
) -> None:
    marked = facts_of(cluster, placement, "marked")
    plain = facts_of(cluster, placement, "plain")
    assert [(f["node"], f["mark"]) for f in marked] == [(1, "1")]
    assert marked[0]["runtime_env"] == {"py_executable": str(paths.marked)}  # nothing else, ever
    assert [(f["node"], f["mark"]) for f in plain] == [(0, None), (1, None)]  # node 1 too: another group
    assert all(not f["runtime_env"] for f in plain)


@pytest.mark.parametrize(
    ("component", "node", "problem"),
    [("missing", 1, "does not exist on node 1"), ("not_executable", 0, "is not executable on node 0")],
)
def test_a_bad_interpreter_fails_in_seconds_naming_rank_node_and_path(
    cluster: Cluster, placement: ComponentPlacement, paths: Paths, component: str, node: int, problem: str
) -> None:
    started = time.monotonic()
    with pytest.raises(WorkerGroupError) as caught:
        launch(cluster, placement, component)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    path = paths.missing if component == "missing" else paths.not_executable
    assert f"worker group {component!r}" in message and f"rank 0 (node {node})" in message
    assert f"python_interpreter_path {str(path)!r} {problem}" in message
    assert caught.value.failed_ranks == [0]
    assert elapsed < 15  # Ray itself would retry the worker every 60 s, forever


def test_an_interpreter_without_ray_is_refused_before_any_actor_starts(
    cluster: Cluster, placement: ComponentPlacement, paths: Paths
) -> None:
    with pytest.raises(WorkerGroupError) as caught:
        launch(cluster, placement, "without_ray")
    message = str(caught.value)
    assert f"python_interpreter_path {str(paths.without_ray)!r} failed on node 1" in message
    assert "No module named 'ray'" in message


def test_a_relative_interpreter_path_is_refused_at_parse_time() -> None:
    cluster_cfg = {
        "num_nodes": 1,
        "node_groups": [interpreter_group("venv", 0, Path("venv/bin/python"))],
    }
    with pytest.raises(PlacementError, match="relative") as caught:
        ClusterSpec.from_config(cluster_cfg, 0)
    assert "env_configs[0].python_interpreter_path" in str(caught.value)


# --- the runtime_env of one worker (pure) --------------------------------------------------------


def test_runtime_env_is_none_unless_something_applies_and_holds_only_py_executable() -> None:
    cfg = {
        "cluster": {
            "num_nodes": 2,
            "node_groups": [interpreter_group("venv", 1, Path("/opt/my venv/bin/python"))],
            "component_placement": {"actor": "0-1", "env": {"node_group": "venv", "placement": "0"}},
        }
    }
    spec = ClusterSpec.from_config(cfg["cluster"], 1)
    placement = ComponentPlacement(cfg, spec)
    (env,) = placement.get_strategy("env").get_placement(spec)
    executable = worker_executable(env, spec)
    assert executable == WorkerExecutable(1, "/opt/my venv/bin/python")
    assert executable.command == "'/opt/my venv/bin/python'"  # quoted: Ray pastes it into a shell line
    actor = placement.get_strategy("actor").get_placement(spec)
    assert [worker_executable(p, spec) for p in actor] == [None, None]
