"""The ``restart`` key of a component: parsed, checked, carried on the strategy (no Ray)."""

from __future__ import annotations

import pytest

from rlinfra import ComponentPlacement
from rlinfra.placement import PlacementError
from rlinfra.placement.cluster_spec import ClusterSpec
from rlinfra.placement.restart import DEFAULT_RESTART, RestartPolicy


@pytest.mark.parametrize(
    ("restart", "message"),
    [
        ({"mx": 3}, "did you mean 'max'"),
        ({"max": -1}, "got -1; expected at least 0"),
        ({"max": True}, "max: expected int, got True"),  # a switch is no count, under its YAML name too
        ({"within_s": 0}, "got 0; expected above 0 (the window the restarts are counted in)"),
        (3, "expected a mapping, got 3"),
    ],
)
def test_restart_setting_is_checked_in_the_yaml(restart, message):
    spec = ClusterSpec.from_config({"num_nodes": 1}, 2)
    bad = {"cluster": {"num_nodes": 1, "component_placement": {"a": {"placement": "0", "restart": restart}}}}
    with pytest.raises(PlacementError) as caught:
        ComponentPlacement(bad, spec)
    assert message in str(caught.value) and "component_placement.a.restart" in str(caught.value)


def test_restart_setting_travels_on_the_strategy():
    spec = ClusterSpec.from_config({"num_nodes": 1}, 2)
    entry = {"placement": "0", "restart": {"max": 5}}
    cfg = {"cluster": {"num_nodes": 1, "component_placement": {"a": entry}}}
    assert ComponentPlacement(cfg, spec).get_strategy("a").restart == RestartPolicy(
        max_restarts=5, within_s=600.0
    )


def test_without_the_key_a_component_gets_the_default_budget():
    spec = ClusterSpec.from_config({"num_nodes": 1}, 2)
    cfg = {"cluster": {"num_nodes": 1, "component_placement": {"a": "0"}}}
    assert ComponentPlacement(cfg, spec).get_strategy("a").restart is None
    assert RestartPolicy(max_restarts=3, within_s=600.0) == DEFAULT_RESTART
