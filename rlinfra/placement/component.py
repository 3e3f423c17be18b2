"""``ComponentPlacement``: the whole ``cluster.component_placement`` section, resolved.

Everything is parsed, checked and materialised in the constructor, so a bad config fails here —
at parse time — and ``get_strategy(...).get_placement(...)`` never raises for a config that
constructed. Cost is linear in the number of processes.
"""

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from rlinfra.config import ConfigError
from rlinfra.placement.cluster_spec import ClusterSpec
from rlinfra.placement.config import (
    ClusterConfig,
    ComponentConfig,
    cluster_section,
    parse_cluster_config,
    parse_components,
)
from rlinfra.placement.config_access import as_mapping
from rlinfra.placement.constraints import Constraints, check_nodes, process_constraints
from rlinfra.placement.env_vars import EnvVars
from rlinfra.placement.errors import PlacementError
from rlinfra.placement.gc_pause import gc_paused
from rlinfra.placement.grammar import parse_placement
from rlinfra.placement.mapping import assign_resources
from rlinfra.placement.memory import GIB, Declared, DeviceMemory, check_engines, plan_devices, refuse_overfull
from rlinfra.placement.model_size import ModelShape, read_model_config
from rlinfra.placement.record import Placement
from rlinfra.placement.strategies import (
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PlacementStrategy,
    as_cluster_spec,
)


class ComponentPlacement:
    """Placements of every component in ``cfg.cluster.component_placement`` on ``cluster``.

    ``cluster`` is a ``ClusterSpec`` (dry run) or a live ``rlinfra.Cluster``, whose parsed config is
    reused when ``cfg.cluster`` is the section it was built from. Components written in
    one key (``"actor,inference": 0-7``) share one strategy object. The mapping form may also give
    ``env_vars`` (the component's environment layer, see ``rlinfra.runtime.env``),
    ``constraints`` (``rlinfra.placement.constraints``), ``num_cpus`` (CPUs per process, see
    ``rlinfra.runtime.bundles``) and ``restart`` (``rlinfra.placement.restart``); they travel on
    the strategy, so that ``launch(cluster, placement.get_strategy(name))`` honours them.
    """

    def __init__(self, cfg: Any, cluster: Any) -> None:
        self.cluster_spec: ClusterSpec = as_cluster_spec(cluster)
        self.config: ClusterConfig = self._parse(cluster_section(cfg), cluster)
        if self.config.num_nodes != self.cluster_spec.num_nodes:
            raise PlacementError(
                f"cluster.num_nodes is {self.config.num_nodes}, but the cluster has "
                f"{self.cluster_spec.num_nodes} node(s)",
                where="cluster.num_nodes",
                expected="the config the cluster was built from",
            )
        if not self.config.components:
            raise PlacementError(
                "missing or empty component_placement",
                where="cluster.component_placement",
                expected="a mapping such as {actor: '0-7'}",
            )
        self._strategies: dict[str, PlacementStrategy] = {}
        with gc_paused():
            for entry in self.config.components:
                strategy = self._resolve(entry)
                self._check_constraints(strategy, strategy.get_placement(self.cluster_spec), entry.key)
                self._strategies.update(dict.fromkeys(entry.names, strategy))
        self.memory: list[DeviceMemory] = self._plan_memory()
        self.memory_warnings: list[str] = []  # overfull devices, with ``cluster.memory_check: warn``
        for device in self.memory:
            if not device.fits:
                error = refuse_overfull(device, self._declared, _PLACEMENT_PATH)
                if self.config.memory_check == "error":
                    raise error
                self.memory_warnings.append(str(error))

    def _parse(self, section: Any, cluster: Any) -> ClusterConfig:
        """``section`` parsed, with the cluster's node count when it gives none. A live ``Cluster``
        has parsed its section already (``.config`` from ``.section``): when ``section`` is the same
        that config is reused, and when only ``component_placement`` differs (a Cluster does not
        use it, so one may serve configs that place different components) only that is parsed."""
        if isinstance(section, ClusterConfig):
            return section
        plain = as_mapping(section)
        plain.setdefault("num_nodes", self.cluster_spec.num_nodes)
        parsed, parsed_from = getattr(cluster, "config", None), getattr(cluster, "section", None)
        if not isinstance(parsed, ClusterConfig) or not isinstance(parsed_from, Mapping):
            return parse_cluster_config(plain)
        if not _identical(_without_placement(plain), _without_placement(parsed_from)):
            return parse_cluster_config(plain)
        placing = plain.get(_PLACEMENT_KEY)
        if _identical(placing, parsed_from.get(_PLACEMENT_KEY)):
            return parsed
        return replace(parsed, components=parse_components(placing, parsed.num_nodes, _PLACEMENT_PATH))

    @property
    def components(self) -> list[str]:
        """Component names in the order the config lists them."""
        return list(self._strategies)

    def get_strategy(self, name: str) -> PlacementStrategy:
        return self._strategies[self._known(name)]

    def get_world_size(self, name: str) -> int:
        return self.get_strategy(name).world_size

    def get_placements(
        self, name: str, isolate_accelerator: bool = True, *, where: str = "ComponentPlacement"
    ) -> list[Placement]:
        """Shortcut for ``get_strategy(name).get_placement(cluster, isolate_accelerator)``; an
        unknown ``name`` is an error attributed to ``where``."""
        strategy = self._strategies[self._known(name, where)]
        return strategy.get_placement(self.cluster_spec, isolate_accelerator)

    def get_hardware_ranks(self, name: str) -> list[int]:
        """The resource ranks the component uses, ascending, each once (RLinf's name)."""
        placements = self.get_placements(name)
        return sorted({rank for placement in placements for rank in placement.hardware_ranks})

    def get_env_vars(self, name: str) -> EnvVars:
        """The component's own ``env_vars`` (its node groups' ``env_configs`` are separate)."""
        return self.get_strategy(name).env_vars

    def get_process_constraints(self, name: str) -> list[Constraints]:
        """Each rank's constraints: its node group's refined by the component's."""
        constraints = self.get_strategy(name).constraints
        return process_constraints(self.get_placements(name), constraints, self.group_constraints)

    @property
    def group_constraints(self) -> dict[str, Constraints]:
        """Each node group's constraints, by label."""
        return {label: group.constraints for label, group in self.cluster_spec.node_groups.items()}

    def _known(self, name: str, where: str = "ComponentPlacement") -> str:
        if name not in self._strategies:
            raise PlacementError(
                f"unknown component {name!r}",
                where=where,
                expected="one of " + ", ".join(repr(c) for c in self._strategies),
            )
        return name

    def _resolve(self, entry: ComponentConfig) -> PlacementStrategy:
        where = f"component {entry.key!r}" if len(entry.names) == 1 else f"components {entry.key!r}"
        path = f"cluster.component_placement.{entry.key}"
        for label in entry.node_groups:
            self.cluster_spec.node_group(label, where=f"{path}.node_group")  # known, or an error
        segments = parse_placement(entry.placement, where)
        pool = self.cluster_spec.resources(entry.node_groups, where=where)
        resources = assign_resources(segments, pool, entry.placement, where)
        kind = NodePlacementStrategy if pool.is_node else FlexiblePlacementStrategy
        strategy = kind.from_checked_ranks(resources, entry.node_groups, where)
        strategy.env_vars, strategy.constraints = entry.env_vars, entry.constraints
        strategy.num_cpus, strategy.restart = entry.num_cpus, entry.restart
        return strategy

    def _plan_memory(self) -> list[DeviceMemory]:
        """Every accelerator's predicted memory (``rlinfra.placement.memory``), for the components
        that declare ``memory``; an engine that cannot hold one request is refused here."""
        self._declared = {
            name: Declared(entry.memory, _model_shape(entry), self.get_world_size(name))
            for entry in self.config.components
            if entry.memory is not None
            for name in entry.names
        }
        if not self._declared:
            return []
        placements = {name: self.get_placements(name) for name in self._declared}
        devices = plan_devices(placements, self._declared, self._accelerator_bytes)
        check_engines(devices, _PLACEMENT_PATH)
        return devices

    def _accelerator_bytes(self, node: int) -> int:
        sizes = [
            group.accelerator_gib
            for group in self.cluster_spec.node_groups.values()
            if group.accelerator_gib is not None and node in group.node_ranks
        ]
        size = sizes[0] if sizes else self.config.accelerator_gib
        if size is None:
            raise PlacementError(
                f"node {node}'s accelerators have no memory size, which the memory plan needs",
                where="cluster.accelerator",
                expected="a known accelerator (H100, A100-80GB, …) or {memory_gib: N}, for the cluster "
                "or the node's node group",
            )
        return int(size * GIB)

    def _check_constraints(self, strategy: PlacementStrategy, placements: list[Placement], key: str) -> None:
        """What can be checked without a live cluster: the allowed nodes, and that node group and
        component labels agree."""
        path = f"cluster.component_placement.{key}.constraints"
        check_nodes(strategy.constraints, placements, f"{path}.nodes")
        groups = self.group_constraints
        if any(groups[label] for label in strategy.node_groups):
            process_constraints(placements, strategy.constraints, groups, where=f"{path}.labels")


def _model_shape(entry: ComponentConfig) -> ModelShape:
    try:
        return ModelShape.of(read_model_config(str(entry.model)))
    except ConfigError as error:  # unreadable, or an architecture the plan cannot count
        raise replace(error, where=f"{_PLACEMENT_PATH}.{entry.key}.model") from None


_PLACEMENT_KEY = "component_placement"
_PLACEMENT_PATH = f"cluster.{_PLACEMENT_KEY}"


def _without_placement(section: Mapping[str, Any]) -> dict[str, Any]:
    """The rest of a cluster section, in key order (the parser reads its keys by name)."""
    return {key: section[key] for key in sorted(section, key=str) if key != _PLACEMENT_KEY}


def _identical(first: Any, second: Any) -> bool:
    """Equal, in the same order and of the same types throughout, as their ``repr`` shows:
    ``True == 1 == 1.0`` in Python but not to the parser, and key order is component order, so
    plain equality could reuse a config that differs from the one the section given parses to."""
    return repr(first) == repr(second)
