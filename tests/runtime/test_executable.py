"""``python_interpreter_path`` and ``cluster.profiling``: parsing (pure), the commands, the node
check, and real workers on a simulated two-node Ray started under a marked interpreter and under a
stand-in ``nsys`` (a test double for the external profiler, not for Ray)."""

from __future__ import annotations

import json
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
from rlinfra.placement.config import parse_cluster_config
from rlinfra.placement.profiling import ProfilingConfig, parse_profiling
from rlinfra.runtime.executable import WorkerExecutable, probe_command, worker_executable, worker_runtime_env

MARK = "RLINFRA_INTERPRETER_MARK"
NSIGHT_OPTIONS = {"t": "cuda,nvtx", "capture-range": "cudaProfilerApi", "stop-on-exit": True}

# The stand-in for nsys: records its arguments under its pid (the worker's, as it execs), then
# runs the application after `profile` and its options, as nsys would.
NSYS_STUB = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.path.join({records!r}, f"{{os.getpid()}}.json"), "w") as out:
    json.dump(args, out)
rest = args[1:]
while rest and rest[0].startswith("-"):
    rest = rest[1:] if rest[0].startswith("--") else rest[2:]
os.execv(rest[0], rest)
"""

# The stand-in for ROCm Systems Profiler's Python module: `python -m rocprofsys <args> -- SCRIPT ...`.
ROCPROFSYS_STUB = """import json, os, runpy, sys
split = sys.argv.index("--")
with open(os.path.join({records!r}, "rocprofsys.json"), "w") as out:
    seen = {{"args": sys.argv[1:split], "freq": os.environ.get("ROCPROFSYS_FREQ")}}
    seen["path"] = os.environ["ROCPROFSYS_OUTPUT_PATH"]
    seen["prefix"] = os.environ["ROCPROFSYS_OUTPUT_PREFIX"]
    json.dump(seen, out)
sys.argv = sys.argv[split + 1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclass(frozen=True)
class Paths:
    marked: Path  # a wrapper interpreter that sets MARK, then runs this Python
    missing: Path
    not_executable: Path
    without_ray: Path  # this Python without site-packages: no Ray
    bin: Path  # holds the stand-in nsys
    records: Path  # what the stand-in nsys saw, one file per process
    profiles: Path


def executable_file(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> Paths:
    root = tmp_path_factory.mktemp("executables")
    for directory in ("bin", "records"):
        (root / directory).mkdir()
    executable_file(
        root / "bin" / "nsys", NSYS_STUB.format(python=sys.executable, records=str(root / "records"))
    )
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
        bin=root / "bin",
        records=root / "records",
        profiles=root / "profiles",
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
                "profiled": {"node_group": "node", "placement": "0-1"},
                "both": {"node_group": "marked", "placement": "0"},
                "missing": {"node_group": "missing", "placement": "0"},
                "not_executable": {"node_group": "not_executable", "placement": "0"},
                "without_ray": {"node_group": "without_ray", "placement": "0"},
            },
            "profiling": {
                "backend": "nsight",
                "worker_groups": "profiled,Both",  # RLinf matches names in any case
                "output_dir": str(paths.profiles),
                "options": NSIGHT_OPTIONS,
                "flags": ["stats"],
            },
        }
    }


@pytest.fixture(scope="module")
def cluster(cfg: dict, paths: Paths) -> Iterator[Cluster]:
    # Ray runs `exec <py_executable> ...` in the environment its raylets were started with, so the
    # stand-in profiler goes on the PATH before the cluster starts (as nsys is on a real node's).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{paths.bin}{os.pathsep}{os.environ['PATH']}")
        live = Cluster(cluster_cfg=cfg["cluster"])
    with live:
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


# --- profiling, live ---------------------------------------------------------------------------


def recorded_args(paths: Paths, pid: int) -> list[str] | None:
    record = paths.records / f"{pid}.json"
    return json.loads(record.read_text()) if record.exists() else None


def nsys_prefix(paths: Paths, group: str, rank: int) -> list[str]:
    return [
        "profile",
        "--stats",
        "-t",
        "cuda,nvtx",
        "--capture-range=cudaProfilerApi",
        "--stop-on-exit=true",
        "-o",
        f"{paths.profiles}/{group}_{rank}_%p",
    ]


def test_the_profiler_wraps_only_the_matching_groups(
    cluster: Cluster, placement: ComponentPlacement, paths: Paths
) -> None:
    profiled = facts_of(cluster, placement, "profiled")
    plain = facts_of(cluster, placement, "plain")
    for rank, facts in enumerate(profiled):
        args = recorded_args(paths, facts["pid"])
        assert args is not None, f"profiled rank {rank} did not run under nsys"
        assert args[:8] == nsys_prefix(paths, "profiled", rank)
        assert args[8] == sys.executable  # the interpreter Ray's workers use on that node
        assert args[9].endswith("default_worker.py")  # then Ray's own worker command
    assert [recorded_args(paths, facts["pid"]) for facts in plain] == [None, None]
    assert paths.profiles.is_dir()  # created on the node by the check, for nsys to write into


def test_the_profiler_wraps_the_node_groups_interpreter(
    cluster: Cluster, placement: ComponentPlacement, paths: Paths
) -> None:
    (facts,) = facts_of(cluster, placement, "both")
    args = recorded_args(paths, facts["pid"])
    assert args is not None and args[:8] == nsys_prefix(paths, "both", 0)
    assert args[8] == str(paths.marked) and facts["mark"] == "1"
    assert list(facts["runtime_env"]) == ["py_executable"]


# --- the node check without a cluster ------------------------------------------------------------


def nsight(**fields: object) -> ProfilingConfig:
    config = parse_profiling({"backend": "nsight", "worker_groups": "all", **fields})
    assert config is not None
    return config


def test_the_check_names_a_profiler_missing_from_the_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys there
    result = probe_command(WorkerExecutable(3, None, nsight(output_dir=str(tmp_path))))
    assert result.problem == (
        "'nsys' (nsight profiler) is not on the PATH of node 3 (the PATH its Ray node was started with)"
    )


def test_the_check_reports_a_profiler_that_refuses_its_options(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    executable_file(tmp_path / "nsys", "#!/bin/sh\necho 'unrecognised option --bogus' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    result = probe_command(WorkerExecutable(0, None, nsight(flags="bogus", output_dir=str(tmp_path))))
    assert result.problem is not None
    assert "failed on node 0 (exit status 1): unrecognised option --bogus" in result.problem
    assert result.python == sys.executable


def test_rocprof_sys_runs_the_interpreter_with_its_module(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    package = tmp_path / "site" / "rocprofsys"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(ROCPROFSYS_STUB.format(records=str(tmp_path)))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    config = parse_profiling(
        {
            "backend": "rocprof_sys",
            "worker_groups": ["env"],
            "output_dir": str(tmp_path / "out"),
            "args": {"F": True, "trace-c": "false"},
            "env": {"ROCPROFSYS_FREQ": 100},
        }
    )
    result = probe_command(WorkerExecutable(0, sys.executable, config))
    assert result.problem is None
    seen = json.loads((tmp_path / "rocprofsys.json").read_text())
    assert seen["args"] == ["-F", "true", "--trace-c=false"] and seen["freq"] == "100"
    assert seen["prefix"] == "probe_%p" and seen["path"] != str(tmp_path / "out")  # the probe's own
    assert (tmp_path / "out").is_dir()


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
    profiling = nsight(worker_groups="actor", output_dir="/p")
    (env,) = placement.get_strategy("env").get_placement(spec)
    actor = placement.get_strategy("actor").get_placement(spec)
    assert worker_executable(env, spec, "env", None) == WorkerExecutable(1, "/opt/my venv/bin/python", None)
    assert worker_runtime_env(env, worker_executable(env, spec, "env", None), "env", "/node/python") == {
        "py_executable": "'/opt/my venv/bin/python'"  # quoted: Ray pastes it into a shell line
    }
    assert worker_executable(actor[0], spec, "actor", None) is None
    wrapped = worker_runtime_env(
        actor[1], worker_executable(actor[1], spec, "actor", profiling), "actor", "/n/py"
    )
    assert wrapped == {"py_executable": "nsys profile -o /p/actor_1_%p /n/py"}


# --- parsing cluster.profiling (pure) ------------------------------------------------------------


def test_absent_profiling_is_none_and_a_parsed_one_passes_through() -> None:
    assert parse_profiling(None) is None
    config = nsight()
    assert parse_profiling(config) is config


def test_worker_groups_forms_and_matching() -> None:
    assert nsight(worker_groups="actor, rollout").worker_groups == ("actor", "rollout")
    assert nsight(worker_groups=["Actor"]).profiles("actor")
    assert nsight(worker_groups="ALL").profiles("anything")
    assert not nsight(worker_groups=None).profiles("actor")  # RLinf's schema: null profiles none
    assert not nsight(worker_groups="all", enabled=False).profiles("actor")
    assert not nsight(worker_groups="actor").profiles("rollout")


def test_nsight_command_and_report_names() -> None:
    config = nsight(output_dir="/out", options={"t": "cuda", "cuda-memory-usage": True}, flags="stats")
    assert config.report_prefix("my group/a", 3) == "/out/my_group_a_3_%p"
    assert config.wrap("/py", "/out/x") == (
        "nsys", "profile", "--stats", "-t", "cuda", "--cuda-memory-usage=true", "-o", "/out/x", "/py",
    )  # fmt: skip
    assert nsight().output_dir == "/tmp/rlinfra-profiles"


@pytest.mark.parametrize(
    ("section", "where", "words"),
    [
        (
            {"backend": "nsight", "optoins": {}},
            "cluster.profiling",
            "unknown key 'optoins'; did you mean 'options'",
        ),
        ({"backend": "nsight", "args": {}}, "cluster.profiling", "unknown key 'args'"),
        ({"backend": "rocprof_sys", "flags": "x"}, "cluster.profiling", "unknown key 'flags'"),
        ({"backend": "nsys"}, "cluster.profiling.backend", "unknown profiling backend 'nsys'"),
        ({"worker_groups": "actor"}, "cluster.profiling", "missing 'backend'"),
        ({"backend": "nsight", "steps": [1, 2]}, "cluster.profiling.steps", "steps cannot be honoured"),
        ({"backend": "nsight", "enabled": "yes"}, "cluster.profiling.enabled", "expected true or false"),
        ({"backend": "nsight", "output_dir": "profiles"}, "cluster.profiling.output_dir", "is relative"),
        ({"backend": "nsight", "worker_groups": 7}, "cluster.profiling.worker_groups", "worker group names"),
        ({"backend": "nsight", "options": {"o": "/x"}}, "cluster.profiling.options.o", "cannot be honoured"),
        ({"backend": "nsight", "options": {"--t": "cuda"}}, "cluster.profiling.options", "bad name '--t'"),
        ({"backend": "nsight", "options": {"t": ["a"]}}, "cluster.profiling.options.t", "no scalar value"),
        (
            {"backend": "nsight", "options": {"t": "x"}, "flags": "t"},
            "cluster.profiling.flags",
            "both a flag",
        ),
        ({"backend": "nsight", "flags": [1]}, "cluster.profiling.flags[0]", "bad flag 1"),
        (
            {"backend": "rocprof_sys", "env": {"ROCPROFSYS_OUTPUT_PATH": "/x"}},
            "cluster.profiling.env.ROCPROFSYS_OUTPUT_PATH",
            "cannot be honoured",
        ),
        (
            {"backend": "rocprof_sys", "env": {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz"}},
            "cluster.profiling.env",
            "looks like a credential",
        ),
    ],
)
def test_refusals_name_the_key(section: dict, where: str, words: str) -> None:
    with pytest.raises(PlacementError) as caught:
        parse_profiling(section)
    assert caught.value.where == where
    assert words in caught.value.problem


def test_the_cluster_parser_refuses_a_bad_profiling_section() -> None:
    with pytest.raises(PlacementError, match="unknown profiling backend 'rocprof'"):
        parse_cluster_config({"num_nodes": 1, "profiling": {"backend": "rocprof"}})
    config = parse_cluster_config({"num_nodes": 1, "profiling": {"backend": "nsight", "worker_groups": "a"}})
    assert config.profiling == nsight(worker_groups="a")
