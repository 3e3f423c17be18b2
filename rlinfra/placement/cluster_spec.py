"""What the cluster looks like, as plain data: nodes, accelerators, custom hardware, node groups.

A ``ClusterSpec`` is built either from the config alone (dry runs: ``from_config``) or, in the
runtime layer, from the nodes Ray reports (``ClusterSpec.build``). Both paths share the node-group
parsing here, which is why ``rlinfra plan`` and a live launch produce identical placements.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from rlinfra.placement.config_access import (
    as_mapping,
    parse_rank_list,
    reject_unknown_keys,
    require_int,
    require_str,
    to_plain,
)
from rlinfra.placement.constraints import NO_CONSTRAINTS, Constraints, parse_constraints
from rlinfra.placement.env_vars import NO_ENV_VARS, EnvVars, parse_env_vars
from rlinfra.placement.errors import PlacementError, Span, short_ranks
from rlinfra.placement.grammar import bounded_int
from rlinfra.placement.resources import NODE_KIND, ResourcePool, build_pool

CLUSTER_GROUP = "cluster"
NODE_GROUP = "node"
RESERVED_GROUPS = (CLUSTER_GROUP, NODE_GROUP)
DEFAULT_ACCELERATOR_TYPE = "GPU"

MAX_NODES = 100_000
MAX_ACCELERATORS_PER_NODE = 1024
_UNIFORM_SPEC = re.compile(r"\s*([0-9]+)\s*[xX]\s*([0-9]+)\s*")
_COUNT = re.compile(r"\s*[0-9]+\s*")

_GROUP_FIELDS = ("label", "node_ranks", "hardware", "env_configs", "ignore_hardware", "constraints")
_ENV_FIELDS = ("node_ranks", "env_vars", "python_interpreter_path")


@dataclass(frozen=True)
class NodeSpec:
    """One node: its cluster node rank and its accelerators (``accelerator_type`` is a Ray resource
    name such as ``GPU`` or ``NPU``)."""

    rank: int
    num_accelerators: int = 0
    accelerator_type: str = DEFAULT_ACCELERATOR_TYPE


@dataclass(frozen=True)
class HardwareUnit:
    """One unit of custom hardware (a robot, a camera rig …) attached to a node.

    ``index`` is the unit's position among this type's units on that node, which is what a worker
    sees as its local hardware rank; ``fields`` keeps the rest of the user's config entry.
    """

    type: str
    node_rank: int
    index: int
    fields: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class EnvConfig:
    """Environment for the processes on some nodes of a group (``env_configs`` in the YAML)."""

    node_ranks: tuple[int, ...]
    env_vars: EnvVars = field(default=NO_ENV_VARS, compare=False)
    python_interpreter_path: str | None = None


@dataclass(frozen=True)
class NodeGroup:
    """A labelled set of nodes whose resources a component may be placed on; ``constraints`` are
    the custom resources and node labels every process placed on the group needs."""

    label: str
    node_ranks: tuple[int, ...]
    hardware_type: str | None = None
    hardware: tuple[HardwareUnit, ...] = ()
    env_configs: tuple[EnvConfig, ...] = ()
    ignore_hardware: bool = False
    constraints: Constraints = NO_CONSTRAINTS


@dataclass(frozen=True, eq=False)
class ClusterSpec:
    """The cluster as the placement engine sees it. Immutable; resource pools are cached per
    choice of node groups, so resolving many components stays linear in the cluster size."""

    nodes: tuple[NodeSpec, ...]
    node_groups: Mapping[str, NodeGroup]

    @classmethod
    def from_config(
        cls,
        cluster_cfg: Any,
        accelerators_per_node: int | Sequence[int] = 8,
        accelerator_type: str = DEFAULT_ACCELERATOR_TYPE,
    ) -> ClusterSpec:
        """A spec for a dry run: ``num_nodes`` nodes from the config, each with
        ``accelerators_per_node`` accelerators (one int for all, or one count per node)."""
        section = as_mapping(cluster_cfg)
        num_nodes = require_int(section.get("num_nodes"), "cluster.num_nodes", minimum=1)
        if num_nodes > MAX_NODES:
            raise PlacementError(
                f"{num_nodes:,} nodes is too many",
                where="cluster.num_nodes",
                expected=f"at most {MAX_NODES:,} nodes",
            )
        counts = _accelerator_counts(accelerators_per_node, num_nodes)
        nodes = tuple(NodeSpec(rank, count, accelerator_type) for rank, count in enumerate(counts))
        return cls.build(nodes, section)

    @classmethod
    def build(cls, nodes: Sequence[NodeSpec], cluster_cfg: Any) -> ClusterSpec:
        """A spec from known nodes (dry run or live Ray) plus the config's node groups."""
        section = as_mapping(cluster_cfg)
        ordered = tuple(sorted(nodes, key=lambda node: node.rank))
        if [node.rank for node in ordered] != list(range(len(ordered))):
            raise PlacementError(
                "node ranks must be 0..N-1 without gaps",
                where="cluster",
                expected=f"{len(ordered)} nodes ranked 0-{len(ordered) - 1}",
            )
        all_ranks = tuple(node.rank for node in ordered)
        groups: dict[str, NodeGroup] = {
            CLUSTER_GROUP: NodeGroup(CLUSTER_GROUP, all_ranks),
            NODE_GROUP: NodeGroup(NODE_GROUP, all_ranks, ignore_hardware=True),
        }
        raw_groups = to_plain(section.get("node_groups")) or []
        if not isinstance(raw_groups, list):
            raise PlacementError(
                f"expected a list of node groups, got {type(raw_groups).__name__}",
                where="cluster.node_groups",
                expected="a YAML list of {label, node_ranks, ...}",
            )
        for index, raw in enumerate(raw_groups):
            group = _parse_group(raw, f"cluster.node_groups[{index}]", len(ordered))
            if group.label in groups:
                what = "reserved" if group.label in RESERVED_GROUPS else "already defined"
                raise PlacementError(
                    f"node group label {group.label!r} is {what}",
                    where=f"cluster.node_groups[{index}].label",
                    expected="a unique label other than 'cluster' and 'node'",
                )
            groups[group.label] = group
        return cls(ordered, groups)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def num_accelerators(self) -> int:
        return sum(node.num_accelerators for node in self.nodes)

    def node_group(self, label: str) -> NodeGroup:
        try:
            return self.node_groups[label]
        except KeyError:
            raise PlacementError(
                f"unknown node group {label!r}",
                expected="one of " + ", ".join(repr(name) for name in self.node_groups),
            ) from None

    def resources(self, labels: Sequence[str], as_nodes: bool = False) -> ResourcePool:
        """The numbered resources of one or more node groups (concatenated in the order given)."""
        key = (tuple(labels), as_nodes)
        pool = self._pools.get(key)
        if pool is None:
            groups = [self.node_group(label) for label in labels]
            pool = build_pool(self, groups, as_nodes)
            self._pools[key] = pool
        return pool

    @cached_property
    def _pools(self) -> dict[tuple[tuple[str, ...], bool], ResourcePool]:
        return {}

    def describe(self) -> str:
        """One line, e.g. ``2 nodes, 16 GPU`` — for headers and error messages."""
        kinds: dict[str, int] = {}
        for node in self.nodes:
            if node.num_accelerators:
                kinds[node.accelerator_type] = kinds.get(node.accelerator_type, 0) + node.num_accelerators
        parts = [f"{self.num_nodes} node{'s' if self.num_nodes != 1 else ''}"]
        parts += [f"{count} {kind}" for kind, count in kinds.items()]
        for group in self.node_groups.values():
            if group.hardware_type and group.hardware:
                parts.append(f"{len(group.hardware)} {group.hardware_type} ({group.label})")
        return ", ".join(parts)


def _checked_count(value: Any, where: str) -> int:
    count = require_int(value, where)
    if count > MAX_ACCELERATORS_PER_NODE:
        raise PlacementError(
            f"{count} accelerators on one node",
            where=where,
            expected=f"at most {MAX_ACCELERATORS_PER_NODE:,} accelerators per node",
        )
    return count


def _accelerator_counts(accelerators_per_node: int | Sequence[int], num_nodes: int) -> list[int]:
    if isinstance(accelerators_per_node, int) and not isinstance(accelerators_per_node, bool):
        return [_checked_count(accelerators_per_node, "accelerators per node")] * num_nodes
    if not isinstance(accelerators_per_node, (list, tuple)):
        raise PlacementError(
            f"expected an int or a list of ints, got {accelerators_per_node!r}",
            where="accelerators per node",
            expected="one int for all nodes, or one count per node",
        )
    counts = [_checked_count(count, "accelerators per node") for count in accelerators_per_node]
    if len(counts) != num_nodes:
        raise PlacementError(
            f"{len(counts)} accelerator counts for {num_nodes} nodes",
            where="accelerators per node",
            expected=f"one int for all nodes, or exactly {num_nodes} counts (cluster.num_nodes)",
        )
    return counts


def _label_text(value: Any, where: str) -> str:
    """A node group label. YAML reads ``label: 4090`` (the seed's own example) as an int, so
    integers are labels too, spelt as written."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return require_str(value, where)


def _parse_group(raw: Any, where: str, num_nodes: int) -> NodeGroup:
    section = as_mapping(raw, where)
    reject_unknown_keys(section, _GROUP_FIELDS, where)
    label = _label_text(section.get("label"), f"{where}.label")
    if "," in label:
        raise PlacementError(
            f"node group label {label!r} contains a comma",
            where=f"{where}.label",
            expected="a label without commas (commas separate labels in node_group)",
        )
    if "node_ranks" not in section:
        raise PlacementError("missing 'node_ranks'", where=where, expected="node_ranks such as '0-1'")
    node_ranks = tuple(sorted(parse_rank_list(section["node_ranks"], f"{where}.node_ranks", num_nodes)))
    ignore_hardware = section.get("ignore_hardware", False)
    if not isinstance(ignore_hardware, bool):
        raise PlacementError(
            f"expected true or false, got {ignore_hardware!r}", where=f"{where}.ignore_hardware"
        )
    hardware_type, hardware = _parse_hardware(section.get("hardware"), f"{where}.hardware", node_ranks)
    env_configs = _parse_env_configs(
        section.get("env_configs"), f"{where}.env_configs", node_ranks, num_nodes
    )
    constraints = parse_constraints(
        section.get("constraints"), f"{where}.constraints", num_nodes, allow_nodes=False
    )
    return NodeGroup(label, node_ranks, hardware_type, hardware, env_configs, ignore_hardware, constraints)


def _parse_hardware(
    raw: Any, where: str, node_ranks: tuple[int, ...]
) -> tuple[str | None, tuple[HardwareUnit, ...]]:
    if raw is None:
        return None, ()
    section = as_mapping(raw, where)
    reject_unknown_keys(section, ("type", "configs"), where)
    hardware_type = require_str(section.get("type"), f"{where}.type")
    if hardware_type.lower() == NODE_KIND:
        raise PlacementError(
            "hardware type 'node' is reserved", where=f"{where}.type", expected="another type name"
        )
    configs = section.get("configs") or []
    if not isinstance(configs, list) or not configs:
        raise PlacementError(
            "a hardware type needs at least one unit",
            where=f"{where}.configs",
            expected="a list of {node_rank: N, ...} entries, one per unit",
        )
    members = set(node_ranks)
    per_node: dict[int, list[dict[str, Any]]] = {}
    for index, entry in enumerate(configs):
        entry_where = f"{where}.configs[{index}]"
        unit = as_mapping(entry, entry_where)
        node_rank = require_int(unit.get("node_rank"), f"{entry_where}.node_rank")
        if node_rank not in members:
            raise PlacementError(
                f"node rank {node_rank} is not in this node group",
                where=f"{entry_where}.node_rank",
                expected=f"one of the group's node ranks {short_ranks(node_ranks)}",
            )
        per_node.setdefault(node_rank, []).append(unit)
    units = tuple(
        HardwareUnit(hardware_type, node_rank, local, {k: v for k, v in unit.items() if k != "node_rank"})
        for node_rank in sorted(per_node)
        for local, unit in enumerate(per_node[node_rank])
    )
    return hardware_type, units


def _parse_env_configs(
    raw: Any, where: str, node_ranks: tuple[int, ...], num_nodes: int
) -> tuple[EnvConfig, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise PlacementError("expected a list", where=where, expected="a list of {node_ranks, env_vars, ...}")
    members = set(node_ranks)
    configs = []
    for index, entry in enumerate(raw):
        entry_where = f"{where}[{index}]"
        section = as_mapping(entry, entry_where)
        reject_unknown_keys(section, _ENV_FIELDS, entry_where)
        ranks = tuple(
            parse_rank_list(
                section.get("node_ranks", list(node_ranks)), f"{entry_where}.node_ranks", num_nodes
            )
        )
        stray = [rank for rank in ranks if rank not in members]
        if stray:
            raise PlacementError(
                f"node rank {stray[0]} is not in this node group",
                where=f"{entry_where}.node_ranks",
                expected=f"node ranks among {short_ranks(node_ranks)}",
            )
        env_vars = parse_env_vars(section.get("env_vars"), f"{entry_where}.env_vars")
        interpreter = section.get("python_interpreter_path")
        if interpreter is not None:
            interpreter = require_str(interpreter, f"{entry_where}.python_interpreter_path")
        configs.append(EnvConfig(ranks, env_vars, interpreter))
    return tuple(configs)


def parse_nodes_spec(spec: Any, where: str = "--nodes") -> list[int]:
    """Accelerators per node from ``'NxG'`` (N nodes with G each) or ``'8,8,4,0'`` (one per node).

    Also accepts a YAML list of counts. Shared by ``rlinfra plan --nodes`` and ``cluster.simulate``.
    """
    expected = "'NxG' (N nodes with G accelerators each, e.g. '2x8') or per-node counts like '8,8,4,0'"
    if isinstance(spec, (list, tuple)):
        counts = [require_int(count, f"{where}[{index}]") for index, count in enumerate(spec)]
    else:
        text = str(spec)
        uniform = _UNIFORM_SPEC.fullmatch(text)
        if uniform:
            num_nodes, per_node = bounded_int(uniform.group(1)), bounded_int(uniform.group(2))
            if per_node is None:
                raise PlacementError(
                    "the accelerator count is too large", where=where, text=text, expected=expected
                )
            counts = [per_node] * (MAX_NODES + 1 if num_nodes is None else min(num_nodes, MAX_NODES + 1))
        else:
            counts = []
            offset = 0
            for part in text.split(","):
                count = bounded_int(part) if _COUNT.fullmatch(part) else None
                if count is None:
                    start = offset + len(part) - len(part.lstrip())
                    raise PlacementError(
                        f"cannot read {part.strip()!r} as an accelerator count",
                        where=where,
                        text=text,
                        span=Span(start, max(start + 1, offset + len(part.rstrip()))),
                        expected=expected,
                    )
                counts.append(count)
                offset += len(part) + 1
    if not counts or len(counts) > MAX_NODES:
        raise PlacementError(
            "too many nodes" if counts else "no nodes",
            where=where,
            expected=f"between 1 and {MAX_NODES:,} nodes; {expected}",
        )
    for index, count in enumerate(counts):
        if count > MAX_ACCELERATORS_PER_NODE:
            raise PlacementError(
                f"node {index} has {count} accelerators",
                where=where,
                expected=f"at most {MAX_ACCELERATORS_PER_NODE:,} accelerators per node",
            )
    return counts
