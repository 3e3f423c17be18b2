"""``ComponentPlacement(cfg, cluster)`` reuses what a live ``Cluster`` parsed instead of parsing
``cfg.cluster`` again, and refuses exactly what a fresh parse refuses."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from omegaconf import OmegaConf

import rlinfra.placement.component as component
from rlinfra.placement import ClusterSpec, ComponentPlacement, NodeSpec, PlacementError, parse_cluster_config
from rlinfra.placement.config_access import as_mapping

NODE_GROUPS = [{"label": "front", "node_ranks": "0"}]
SECTION: dict[str, Any] = {
    "num_nodes": 2,
    "num_gpus_per_node": 4,
    "node_groups": NODE_GROUPS,
    "component_placement": {"actor": "0-7", "env": {"node_group": "front", "placement": "0-3"}},
}


class ParsedCluster:
    """What ``ComponentPlacement`` reads of a live ``rlinfra.Cluster`` (``config``, the ``section``
    it was parsed from, ``spec``), made as ``Cluster.__init__`` makes them, without Ray."""

    def __init__(self, section: Any) -> None:
        self.section = copy.deepcopy(as_mapping(section))
        self.config = parse_cluster_config(self.section)
        nodes = [NodeSpec(rank, 4) for rank in range(self.config.num_nodes)]
        self.spec = ClusterSpec.build(nodes, self.config)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """How often ``ComponentPlacement`` parses a whole cluster section, and a component section."""
    counts = {"cluster": 0, "components": 0}

    def counted(name: str, parse: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return parse(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(component, "parse_cluster_config", counted("cluster", component.parse_cluster_config))
    monkeypatch.setattr(component, "parse_components", counted("components", component.parse_components))
    yield counts


def test_the_section_the_cluster_parsed_is_not_parsed_again(parses: dict[str, int]) -> None:
    cluster = ParsedCluster(SECTION)
    placement = ComponentPlacement({"cluster": SECTION}, cluster)
    assert placement.config is cluster.config
    assert parses == {"cluster": 0, "components": 0}
    assert placement.components == ["actor", "env"] and placement.get_world_size("actor") == 8


def test_a_hydra_config_of_the_same_section_is_not_parsed_again(parses: dict[str, int]) -> None:
    cfg = OmegaConf.create({"gpus": 4, "cluster": {**SECTION, "num_gpus_per_node": "${gpus}"}})
    cluster = ParsedCluster(cfg.cluster)
    assert ComponentPlacement(cfg, cluster).config is cluster.config
    assert parses == {"cluster": 0, "components": 0}


def test_only_component_placement_is_parsed_when_only_it_differs(parses: dict[str, int]) -> None:
    """One Cluster serves configs that place different components (a Cluster does not use them)."""
    cluster = ParsedCluster({key: value for key, value in SECTION.items() if key != "component_placement"})
    section = {**SECTION, "component_placement": {"env,actor": {"node_group": "front", "placement": "all"}}}
    placement = ComponentPlacement({"cluster": section}, cluster)
    assert parses == {"cluster": 0, "components": 1}
    assert placement.config.node_groups is cluster.config.node_groups
    assert placement.config == parse_cluster_config(section)
    assert placement.components == ["env", "actor"] and placement.get_world_size("env") == 4


def test_component_errors_read_as_in_a_full_parse() -> None:
    cluster = ParsedCluster(SECTION)
    bad = {**SECTION, "component_placement": {"actor": {"placement": "0-7", "num_cpu": 2}}}
    with pytest.raises(PlacementError) as reused:
        ComponentPlacement({"cluster": bad}, cluster)
    with pytest.raises(PlacementError) as parsed:
        parse_cluster_config(bad)
    assert str(reused.value) == str(parsed.value)
    assert "did you mean 'num_cpus'?" in str(reused.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_nodes": 3}, "cluster.num_nodes is 3, but the cluster has 2 node(s)"),
        ({"num_gpus_per_node": True}, "cluster.num_gpus_per_node: expected int, got True"),
        ({"node_grups": []}, "did you mean 'node_groups'?"),
        ({"component_placement": {}}, "missing or empty component_placement"),
    ],
)
def test_a_section_that_differs_is_parsed_and_refused_as_before(change: dict[str, Any], message: str) -> None:
    """``num_gpus_per_node: true`` equals the cluster's ``1`` in Python, but is not a count."""
    cluster = ParsedCluster({**SECTION, "num_gpus_per_node": 1})
    with pytest.raises(PlacementError, match=re.escape(message)):
        ComponentPlacement({"cluster": {**SECTION, "num_gpus_per_node": 1, **change}}, cluster)


def test_a_section_without_num_nodes_takes_the_clusters(parses: dict[str, int]) -> None:
    cluster = ParsedCluster(SECTION)
    section = {key: value for key, value in SECTION.items() if key != "num_nodes"}
    assert ComponentPlacement({"cluster": section}, cluster).config is cluster.config
    assert parses == {"cluster": 0, "components": 0}


def test_a_spec_alone_parses_the_section(parses: dict[str, int]) -> None:
    spec = ClusterSpec.from_config(SECTION, 4)
    assert ComponentPlacement({"cluster": SECTION}, spec).config == parse_cluster_config(SECTION)
    assert parses == {"cluster": 1, "components": 0}
