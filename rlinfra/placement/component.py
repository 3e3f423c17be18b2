"""``ComponentPlacement``: the whole ``cluster.component_placement`` section, resolved.

Everything is parsed, checked and materialised in the constructor, so a bad config fails here —
at parse time — and ``get_strategy(...).get_placement(...)`` never raises for a config that
constructed. Cost is linear in the number of processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlinfra.placement.cluster_spec import CLUSTER_GROUP, ClusterSpec
from rlinfra.placement.config_access import cluster_section, reject_unknown_keys, to_plain
from rlinfra.placement.constraints import (
    NO_CONSTRAINTS,
    Constraints,
    check_nodes,
    parse_constraints,
    process_constraints,
)
from rlinfra.placement.env_vars import NO_ENV_VARS, EnvVars, parse_env_vars
from rlinfra.placement.errors import PlacementError
from rlinfra.placement.gc_pause import gc_paused
from rlinfra.placement.grammar import parse_placement
from rlinfra.placement.mapping import assign_resources
from rlinfra.placement.record import Placement
from rlinfra.placement.strategies import (
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PlacementStrategy,
    as_cluster_spec,
)

_COMPONENT_FIELDS = ("node_group", "placement", "env_vars", "constraints")


class ComponentPlacement:
    """Placements of every component in ``cfg.cluster.component_placement`` on ``cluster``.

    ``cluster`` is a ``ClusterSpec`` (dry run) or a live ``rlinfra.Cluster``. Components written in
    one key (``"actor,inference": 0-7``) share one strategy object. The mapping form may also give
    ``env_vars`` (the component's environment layer, see ``rlinfra.runtime.env``) and
    ``constraints`` (``rlinfra.placement.constraints``); both travel on the strategy, so that
    ``launch(cluster, placement.get_strategy(name))`` honours them.
    """

    def __init__(self, cfg: Any, cluster: Any) -> None:
        self.cluster_spec: ClusterSpec = as_cluster_spec(cluster)
        section = cluster_section(cfg)
        raw = to_plain(section.get("component_placement"))
        if not isinstance(raw, Mapping) or not raw:
            raise PlacementError(
                "missing or empty component_placement",
                where="cluster.component_placement",
                expected="a mapping such as {actor: '0-7'}",
            )
        self._strategies: dict[str, PlacementStrategy] = {}
        self._placements: dict[str, list[Placement]] = {}
        self._texts: dict[str, str] = {}
        with gc_paused():
            for key, value in raw.items():
                names = _component_names(key)
                strategy, text = self._resolve(names, key, value)
                placements = strategy.get_placement(self.cluster_spec)
                self._check_constraints(strategy, placements, key)
                for name in names:
                    self._strategies[name] = strategy
                    self._placements[name] = placements
                    self._texts[name] = text

    @property
    def components(self) -> list[str]:
        """Component names in the order the config lists them."""
        return list(self._strategies)

    def get_strategy(self, name: str) -> PlacementStrategy:
        return self._strategies[self._known(name)]

    def get_world_size(self, name: str) -> int:
        return len(self._placements[self._known(name)])

    def get_placements(self, name: str, isolate_accelerator: bool = True) -> list[Placement]:
        """Shortcut for ``get_strategy(name).get_placement(cluster, isolate_accelerator)``."""
        return self.get_strategy(name).get_placement(self.cluster_spec, isolate_accelerator)

    def get_node_groups(self, name: str) -> tuple[str, ...]:
        return self.get_strategy(name).node_groups

    def get_placement_text(self, name: str) -> str:
        """The placement string as the user wrote it (normalised to a string)."""
        return self._texts[self._known(name)]

    def get_env_vars(self, name: str) -> EnvVars:
        """The component's own ``env_vars`` (its node groups' ``env_configs`` are separate)."""
        return self.get_strategy(name).env_vars

    def get_constraints(self, name: str) -> Constraints:
        """The component's own ``constraints`` (its node groups' are merged in per process)."""
        return self.get_strategy(name).constraints

    def get_process_constraints(self, name: str) -> list[Constraints]:
        """Each rank's constraints: its node group's refined by the component's."""
        strategy = self.get_strategy(name)
        return process_constraints(
            self._placements[name], strategy.constraints, self.cluster_spec.node_groups
        )

    def _known(self, name: str) -> str:
        if name not in self._strategies:
            raise PlacementError(
                f"unknown component {name!r}",
                where="ComponentPlacement",
                expected="one of " + ", ".join(repr(c) for c in self._strategies),
            )
        return name

    def _resolve(self, names: list[str], key: str, value: Any) -> tuple[PlacementStrategy, str]:
        where = f"component {key!r}" if len(names) == 1 else f"components {key!r}"
        path = f"cluster.component_placement.{key}"
        for name in names:
            if name in self._strategies:
                raise PlacementError(
                    f"component {name!r} is placed twice", where=path, expected="each component in one key"
                )
        node_group: Any = CLUSTER_GROUP
        env_vars, constraints = NO_ENV_VARS, NO_CONSTRAINTS
        if isinstance(value, Mapping):
            reject_unknown_keys(value, _COMPONENT_FIELDS, path)
            if "placement" not in value:
                raise PlacementError(
                    "missing 'placement'", where=path, expected="placement: a string such as '0-7'"
                )
            node_group = value.get("node_group", CLUSTER_GROUP)
            env_vars = parse_env_vars(value.get("env_vars"), f"{path}.env_vars")
            constraints = parse_constraints(
                value.get("constraints"), f"{path}.constraints", self.cluster_spec.num_nodes
            )
            value = value["placement"]
        text = _placement_text(value, path)
        labels = _node_group_labels(node_group, f"{path}.node_group", self.cluster_spec)
        segments = parse_placement(text, where)
        try:
            pool = self.cluster_spec.resources(labels)
        except PlacementError as error:
            raise error.within(where) from None
        resources = assign_resources(segments, pool, text, where)
        kind = NodePlacementStrategy if pool.is_node else FlexiblePlacementStrategy
        strategy = kind._trusted(resources, labels, where)
        strategy.env_vars, strategy.constraints = env_vars, constraints
        return strategy, text

    def _check_constraints(self, strategy: PlacementStrategy, placements: list[Placement], key: str) -> None:
        """What can be checked without a live cluster: the allowed nodes, and that node group and
        component labels agree."""
        path = f"cluster.component_placement.{key}.constraints"
        check_nodes(strategy.constraints, placements, f"{path}.nodes")
        groups = self.cluster_spec.node_groups
        if any(groups[label].constraints for label in strategy.node_groups):
            try:
                process_constraints(placements, strategy.constraints, groups)
            except PlacementError as error:
                raise error.within(f"{path}.labels") from None


def _component_names(key: Any) -> list[str]:
    if not isinstance(key, str):
        key = str(key)
    names = [name.strip() for name in key.split(",")]
    if any(not name for name in names):
        raise PlacementError(
            f"empty component name in {key!r}",
            where="cluster.component_placement",
            expected="component names separated by single commas, e.g. 'actor,inference'",
        )
    if len(set(names)) != len(names):
        raise PlacementError(
            f"a component is named twice in {key!r}",
            where="cluster.component_placement",
            expected="each component once",
        )
    return names


def _placement_text(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise PlacementError(
            f"expected a placement string, got {value!r}",
            where=where,
            expected="a string such as '0-7' or '0-3:0-7', or a mapping {node_group, placement}",
        )
    return str(value)


def _node_group_labels(value: Any, where: str, spec: ClusterSpec) -> tuple[str, ...]:
    """``node_group`` as one label, a comma-separated string, or a YAML list of labels (YAML reads
    ``node_group: 4090`` as an int, so integers are labels too)."""
    if isinstance(value, int) and not isinstance(value, bool):
        labels = [str(value)]
    elif isinstance(value, str):
        labels = [label.strip() for label in value.split(",")]
    elif isinstance(value, (list, tuple)) and value:
        labels = [_as_label(label) for label in value]
    else:
        raise PlacementError(
            f"expected node group label(s), got {value!r}",
            where=where,
            expected="a label, 'a,b', or a YAML list of labels",
        )
    for label in labels:
        if not isinstance(label, str) or not label:
            raise PlacementError(
                f"bad node group label {label!r} in {value!r}",
                where=where,
                expected="non-empty labels separated by commas",
            )
        if label not in spec.node_groups:
            raise PlacementError(
                f"unknown node group {label!r}",
                where=where,
                expected="one of " + ", ".join(repr(name) for name in spec.node_groups),
            )
    if len(set(labels)) != len(labels):
        raise PlacementError(f"a node group is listed twice in {value!r}", where=where)
    return tuple(labels)


def _as_label(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value.strip() if isinstance(value, str) else value
