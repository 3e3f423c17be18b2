"""What the cluster looks like, as plain data: nodes, accelerators, custom hardware, node groups.

A ``ClusterSpec`` is built either from the config alone (dry runs: ``from_config``) or, in the
runtime layer, from the nodes Ray reports (``ClusterSpec.build``). Both take the node groups from
the same parsed ``ClusterConfig``, which is why ``rlinfra plan`` and a live launch produce
identical placements.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlinfra.placement.config import (
    MAX_ACCELERATORS_PER_NODE,
    ClusterConfig,
    parse_cluster_config,
    parse_nodes_spec,
)
from rlinfra.placement.config_access import require_int
from rlinfra.placement.errors import PlacementError, plural
from rlinfra.placement.node_groups import (
    CLUSTER_GROUP,
    DEFAULT_ACCELERATOR_TYPE,
    NODE_GROUP,
    HardwareUnit,
    NodeGroup,
    NodeSpec,
)
from rlinfra.placement.record import Placement
from rlinfra.placement.resources import ResourcePool, build_pool


@dataclass(frozen=True, eq=False)
class ClusterSpec:
    """The cluster as the placement engine sees it. Immutable; resource pools are cached per
    choice of node groups, so resolving many components stays linear in the cluster size."""

    nodes: tuple[NodeSpec, ...]
    node_groups: Mapping[str, NodeGroup]
    _pools: dict[tuple[tuple[str, ...], bool], ResourcePool] = field(
        default_factory=dict, init=False, repr=False
    )

    @classmethod
    def from_config(
        cls,
        cluster_cfg: Any,
        accelerators_per_node: int | Sequence[int] = 8,
        accelerator_type: str = DEFAULT_ACCELERATOR_TYPE,
    ) -> ClusterSpec:
        """A spec for a dry run: ``num_nodes`` nodes from the config, each with
        ``accelerators_per_node`` accelerators (one int for all, or one count per node)."""
        config = parse_cluster_config(cluster_cfg)
        counts = _accelerator_counts(accelerators_per_node, config.num_nodes)
        nodes = tuple(NodeSpec(rank, count, accelerator_type) for rank, count in enumerate(counts))
        return cls.build(nodes, config)

    @classmethod
    def build(cls, nodes: Sequence[NodeSpec], config: ClusterConfig) -> ClusterSpec:
        """A spec from known nodes (dry run or live Ray) plus the node groups of ``config``."""
        ordered = tuple(sorted(nodes, key=lambda node: node.rank))
        if [node.rank for node in ordered] != list(range(len(ordered))):
            raise PlacementError(
                "node ranks must be 0..N-1 without gaps",
                where="cluster",
                expected=f"{len(ordered)} nodes ranked 0-{len(ordered) - 1}",
            )
        every = tuple(range(len(ordered)))
        reserved = [NodeGroup(CLUSTER_GROUP, every), NodeGroup(NODE_GROUP, every, ignore_hardware=True)]
        return cls(ordered, {group.label: group for group in (*reserved, *config.node_groups)})

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def num_accelerators(self) -> int:
        return sum(node.num_accelerators for node in self.nodes)

    def node_group(self, label: str, where: str | None = None) -> NodeGroup:
        try:
            return self.node_groups[label]
        except KeyError:
            raise PlacementError(
                f"unknown node group {label!r}",
                where=where,
                expected="one of " + ", ".join(repr(name) for name in self.node_groups),
            ) from None

    def resources(
        self, labels: Sequence[str], as_nodes: bool = False, where: str | None = None
    ) -> ResourcePool:
        """The numbered resources of one or more node groups (concatenated in the order given);
        errors are attributed to ``where``."""
        key = (tuple(labels), as_nodes)
        if key not in self._pools:
            try:
                groups = [self.node_group(label) for label in labels]
                self._pools[key] = build_pool(self.nodes, groups, as_nodes)
            except PlacementError as error:
                raise error.within(where) from None
        return self._pools[key]

    def check_accelerators_per_node(self, expected: int | None) -> None:
        """RLinf's ``cluster.num_gpus_per_node``: every node must have that many accelerators
        (a live cluster that does not is the wrong cluster, or a node lost its devices)."""
        if expected is None:
            return
        wrong = [node for node in self.nodes if node.num_accelerators != expected]
        if wrong:
            listed = ", ".join(f"node {node.rank} has {node.num_accelerators}" for node in wrong[:4])
            raise PlacementError(
                f"cluster.num_gpus_per_node is {expected}, but {listed}",
                where="cluster.num_gpus_per_node",
                expected=f"{expected} accelerators on every node, or the count the nodes have",
            )

    def hardware_units(self, placement: Placement) -> tuple[HardwareUnit, ...]:
        """The custom hardware units a process drives (none for accelerators and whole nodes)."""
        group = self.node_groups.get(placement.node_group_label)
        if group is None or placement.hardware_type != group.hardware_type:
            return ()
        units = [unit for unit in group.hardware if unit.node_rank == placement.cluster_node_rank]
        return tuple(units[index] for index in placement.local_hardware_ranks)

    def describe(self) -> str:
        """One line, e.g. ``2 nodes, 16 GPU`` — for headers and error messages."""
        kinds: Counter[str] = Counter()
        for node in self.nodes:
            kinds[node.accelerator_type] += node.num_accelerators
        parts = [plural(self.num_nodes, "node")]
        parts += [f"{count} {kind}" for kind, count in kinds.items() if count]
        for group in self.node_groups.values():
            if group.hardware_type and group.hardware:
                parts.append(f"{len(group.hardware)} {group.hardware_type} ({group.label})")
        return ", ".join(parts)


def _accelerator_counts(per_node: int | Sequence[int], num_nodes: int) -> list[int]:
    where = "accelerators per node"
    if isinstance(per_node, int) and not isinstance(per_node, bool):
        return [require_int(per_node, where, maximum=MAX_ACCELERATORS_PER_NODE)] * num_nodes
    if not isinstance(per_node, (list, tuple)):
        raise PlacementError(
            f"expected an int or a list of ints, got {per_node!r}",
            where=where,
            expected="one int for all nodes, or one count per node",
        )
    return parse_nodes_spec(per_node, where, num_nodes)


__all__ = ["ClusterSpec"]
