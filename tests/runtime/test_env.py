"""Environment layering: precedence, path-like merging, no mutation, credential refusal,
and one live check that a worker process gets the composition."""

from __future__ import annotations

import copy
import os
import sys
from typing import ClassVar

import pytest

from rlinfra import Cluster, Worker
from rlinfra.placement import ClusterSpec, ComponentPlacement, PlacementError, parse_cluster_config
from rlinfra.placement.env_vars import EnvVars, looks_like_secret, parse_env_vars
from rlinfra.runtime.env import (
    DEFAULT_ALLOWLIST,
    EnvLayer,
    WorkerEnvs,
    compose_env,
    driver_layer,
)

# The last test starts Ray (a worker gets the composed environment): the module is `ray`.
pytestmark = pytest.mark.ray

CFG = {
    "cluster": {
        "num_nodes": 2,
        "component_placement": {
            "actor": {"placement": "0-1", "env_vars": {"LEVEL": "component", "PYTHONPATH": "/comp"}},
            "rollout": {"node_group": "infer", "placement": "0-1"},
        },
        "node_groups": [
            {
                "label": "infer",
                "node_ranks": 1,
                "env_configs": [{"env_vars": [{"LEVEL": "group"}, {"PYTHONPATH": "/group"}]}],
            }
        ],
    }
}


def placement_of(cfg: dict, accelerators: int = 2) -> ComponentPlacement:
    return ComponentPlacement(cfg, ClusterSpec.from_config(cfg["cluster"], accelerators))


class Defaults:
    env_defaults: ClassVar[dict[str, str]] = {"LEVEL": "class", "ONLY_CLASS": "x", "PYTHONPATH": "/cls"}


# --- composition ---------------------------------------------------------------------------------


def test_precedence_lowest_to_highest() -> None:
    layers = [
        EnvLayer("class defaults", {"A": "class", "B": "class", "C": "class", "D": "class", "E": "class"}),
        EnvLayer("driver", {"B": "driver", "C": "driver", "D": "driver", "E": "driver"}),
        EnvLayer("node group", {"C": "group", "D": "group", "E": "group"}),
        EnvLayer("component", {"D": "component", "E": "component"}),
        EnvLayer("rlinfra", {"E": "rlinfra"}),
    ]
    env = compose_env(*layers)
    assert dict(env.values) == {"A": "class", "B": "driver", "C": "group", "D": "component", "E": "rlinfra"}
    assert env.sources["A"] == "class defaults" and env.sources["E"] == "rlinfra"


def test_path_variables_merge_higher_first_without_repeats() -> None:
    env = compose_env(
        EnvLayer("class defaults", {"PYTHONPATH": "/a", "PATH": "/usr/bin"}),
        EnvLayer("driver", {"PYTHONPATH": "/b:/a", "PATH": "/bin:/usr/bin"}),
        EnvLayer("component", {"PYTHONPATH": "/c::/b", "OTHER": "x"}),
    )
    assert env.values["PYTHONPATH"] == "/c:/b:/a"  # empty entries dropped (they mean the cwd)
    assert env.values["PATH"] == "/bin:/usr/bin"
    assert env.sources["PYTHONPATH"] == "component + driver + class defaults"
    assert env.merge_with_inherited == ("PATH", "PYTHONPATH")


def test_a_layer_can_overwrite_a_path_variable() -> None:
    env = compose_env(
        EnvLayer("driver", {"LD_LIBRARY_PATH": "/drv"}),
        EnvLayer("component", {"LD_LIBRARY_PATH": "/only"}, replace=frozenset({"LD_LIBRARY_PATH"})),
        EnvLayer("rlinfra", {"LD_LIBRARY_PATH": "/top"}),
    )
    assert env.values["LD_LIBRARY_PATH"] == "/top:/only"  # merges above the replacement, not below
    assert "LD_LIBRARY_PATH" in env.replaced and env.merge_with_inherited == ()


def test_yaml_merge_false_overwrites() -> None:
    parsed = parse_env_vars({"LD_LIBRARY_PATH": {"value": "/opt/lib", "merge": False}}, "x")
    assert dict(parsed) == {"LD_LIBRARY_PATH": "/opt/lib"} and parsed.replace == {"LD_LIBRARY_PATH"}
    env = compose_env(EnvLayer("driver", {"LD_LIBRARY_PATH": "/drv"}), EnvLayer("component", parsed))
    assert env.values["LD_LIBRARY_PATH"] == "/opt/lib"
    with pytest.raises(PlacementError, match="not path-like"):
        parse_env_vars({"FOO": {"value": "1", "merge": False}}, "x")


def test_callers_dicts_are_never_mutated() -> None:
    lower = {"PATH": "/a", "X": "1"}
    higher = {"PATH": "/b", "X": "2"}
    snapshot = copy.deepcopy((lower, higher))
    env = compose_env(EnvLayer("driver", lower), EnvLayer("component", higher))
    lower["Y"] = "late"  # changing the input afterwards does not reach the result either
    assert (dict(lower) | {"Y": "late"}, higher) == (snapshot[0] | {"Y": "late"}, snapshot[1])
    assert "Y" not in env.values
    with pytest.raises(TypeError):
        env.values["X"] = "3"  # type: ignore[index]


def test_driver_layer_takes_the_allow_list_only_and_withholds_credentials() -> None:
    environ = {"PATH": "/bin", "LC_ALL": "C", "HF_TOKEN": "hf_x", "SECRET_STUFF": "s", "MY_VAR": "m"}
    layer, withheld = driver_layer(environ, DEFAULT_ALLOWLIST)
    assert dict(layer.values) == {"PATH": "/bin", "LC_ALL": "C"}
    extra = parse_cluster_config({"num_nodes": 1, "env_allowlist": ["HF_*", "MY_VAR"]}).env_allowlist
    _, withheld = driver_layer(environ, (*DEFAULT_ALLOWLIST, *extra))
    assert withheld == ("HF_TOKEN",)
    with pytest.raises(PlacementError, match=r"cluster\.env_allowlist"):
        parse_cluster_config({"num_nodes": 1, "env_allowlist": "HF_*"})


def test_worker_env_of_each_component() -> None:
    placement = placement_of(CFG)
    driver = {"PYTHONPATH": "/drv", "LEVEL": "driver", "HOME": "/home/u", "AWS_SECRET_ACCESS_KEY": "k"}
    actor = WorkerEnvs(
        placement.cluster_spec,
        worker_cls=Defaults,
        component_env=placement.get_env_vars("actor"),
        component="actor",
        driver_env=driver,
    ).of(placement.get_placements("actor")[1])
    assert actor.values["LEVEL"] == "component" and actor.sources["LEVEL"] == "component 'actor'"
    assert actor.values["ONLY_CLASS"] == "x" and actor.sources["ONLY_CLASS"] == "class defaults"
    assert actor.values["PYTHONPATH"] == "/comp:/drv:/cls"
    assert actor.values["RANK"] == "1" and actor.values["CUDA_VISIBLE_DEVICES"] == "1"
    assert actor.values["HOME"] == "/home/u" and "AWS_SECRET_ACCESS_KEY" not in actor.values
    rollout = WorkerEnvs(placement.cluster_spec, worker_cls=Defaults, driver_env=driver).of(
        placement.get_placements("rollout")[0]
    )
    assert rollout.values["LEVEL"] == "group" and rollout.sources["LEVEL"] == "node group 'infer'"
    assert rollout.values["PYTHONPATH"] == "/group:/drv:/cls"
    assert rollout.values["NODE_RANK"] == "1"


# --- credentials ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("HF_TOKEN", "hf_abc", True),
        ("WANDB_API_KEY", "0123", True),
        ("AWS_SECRET_ACCESS_KEY", "x", True),
        ("DB_PASSWORD", "hunter2", True),
        ("OPENAI_APIKEY", "sk", True),
        ("DATABASE_URL", "postgres://user:pw@db:5432/x", True),
        ("REDIS", "redis://:pw@host", True),
        ("TOKENIZERS_PARALLELISM", "false", False),
        ("HF_TOKEN_PATH", "/run/token", False),
        ("WANDB_DISABLE_KEY", "1", False),
        ("PWD", "/home", False),
        ("HOMEPAGE", "https://example.org", False),
    ],
)
def test_looks_like_secret(name: str, value: str, expected: bool) -> None:
    assert looks_like_secret(name, value) is expected


def test_credentials_in_env_vars_are_refused_without_echoing_them() -> None:
    cfg = copy.deepcopy(CFG)
    cfg["cluster"]["component_placement"]["actor"]["env_vars"]["HF_TOKEN"] = "hf_SUPERSECRET"
    with pytest.raises(PlacementError) as caught:
        placement_of(cfg)
    message = str(caught.value)
    assert "cluster.component_placement.actor.env_vars" in message and "'HF_TOKEN'" in message
    assert "cluster.secrets" in message and "self.secret('HF_TOKEN')" in message
    assert "hf_SUPERSECRET" not in message
    group_cfg = copy.deepcopy(CFG)
    group_cfg["cluster"]["node_groups"][0]["env_configs"][0]["env_vars"] = {
        "MIRROR": "https://u:p@host/simple"
    }
    with pytest.raises(PlacementError, match="user:password") as caught:
        placement_of(group_cfg)
    assert "u:p@" not in str(caught.value)


def test_class_defaults_are_checked_too() -> None:
    class Leaky:
        env_defaults: ClassVar[dict[str, str]] = {"GITHUB_TOKEN": "ghp_x"}

    placement = placement_of(CFG)
    with pytest.raises(PlacementError, match=r"Leaky\.env_defaults"):
        WorkerEnvs(placement.cluster_spec, worker_cls=Leaky)


def test_env_vars_is_a_read_only_mapping() -> None:
    parsed = parse_env_vars([{"A": 1}, {"B": True}], "x")
    assert isinstance(parsed, EnvVars) and dict(parsed) == {"A": "1", "B": "True"}
    with pytest.raises(TypeError):
        parsed["A"] = "2"  # type: ignore[index]


# --- in a live worker -----------------------------------------------------------------------------


class EnvProbe(Worker):
    env_defaults: ClassVar[dict[str, str]] = {"LEVEL": "class", "ONLY_CLASS": "yes", "PYTHONPATH": "/cls"}

    def read(self) -> tuple[dict[str, str | None], list[str]]:
        names = ["LEVEL", "ONLY_CLASS", "PYTHONPATH", "PATH", "LD_LIBRARY_PATH", "RANK"]
        return {name: os.environ.get(name) for name in names}, list(sys.path)


def test_a_worker_process_gets_the_composed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", "/inherited")  # the raylet, so the worker, inherits it
    cluster_cfg = {
        "num_nodes": 1,
        "component_placement": {
            "probe": {
                "node_group": "node",
                "placement": "0:0",
                "env_vars": {
                    "LEVEL": "component",
                    "PYTHONPATH": "/comp",
                    "PATH": "/comp/bin",
                    "LD_LIBRARY_PATH": {"value": "/only", "merge": False},
                },
            }
        },
    }
    with Cluster(cluster_cfg=cluster_cfg) as cluster:
        strategy = ComponentPlacement({"cluster": cluster_cfg}, cluster).get_strategy("probe")
        group = EnvProbe.create_group().launch(cluster, strategy, name="probe", num_cpus=0.1)
        try:
            (env, path), *_ = group.read().wait()
        finally:
            group.shutdown()
    assert env["LEVEL"] == "component" and env["ONLY_CLASS"] == "yes" and env["RANK"] == "0"
    entries = env["PYTHONPATH"].split(":")
    assert entries[0] == "/comp" and "/cls" in entries  # component first, class defaults merged in
    assert "/comp" in path and "/cls" in path  # PYTHONPATH reaches imports, not only os.environ
    assert env["PATH"].startswith("/comp/bin:") and "/usr/bin" in env["PATH"].split(":")
    assert env["LD_LIBRARY_PATH"] == "/only"  # merge: false overwrites the inherited value too
