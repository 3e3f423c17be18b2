"""Numbering the resources a component is placed on.

A node group offers one kind of resource: its declared hardware type if any (robots …), else its
accelerators, else its nodes (``ignore_hardware: true`` and the reserved ``node`` group force
nodes). Resources are numbered node by node in node-rank order, and several groups concatenate in
the order listed — also groups of different kinds (GPUs, then robots, as RLinf allows) and groups
that share a node, as long as no resource is offered twice. Each resource keeps its own kind. The
pool stores flat per-resource arrays so that every lookup afterwards is O(1) (RLinf re-scans all
nodes per process, which is what makes it quadratic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlinfra.placement.errors import PlacementError, short_ranks
from rlinfra.placement.node_groups import NODE_KIND, NodeGroup, NodeSpec


@dataclass(frozen=True, eq=False)
class ResourcePool:
    """Resources ``0..size-1`` of some node groups: for each, its node, node-local index, group and
    kind. ``accelerator_kinds`` are the kinds that are accelerators (they get a visibility
    variable); ``nodes`` are the cluster's nodes, by rank."""

    node_of: Sequence[int]
    local_of: Sequence[int]
    group_of: Sequence[str]
    kind_of: Sequence[str]
    kinds: tuple[str, ...]
    accelerator_kinds: frozenset[str]
    nodes: Sequence[NodeSpec]
    description: str

    @property
    def size(self) -> int:
        return len(self.node_of)

    @property
    def is_node(self) -> bool:
        """Every resource is a whole node (the ``node`` group, CPU-only groups)."""
        return self.kinds == (NODE_KIND,)

    @property
    def kind(self) -> str:
        """The kind's name for messages: ``GPU``, ``robot`` … or ``resource`` for a mixed pool."""
        return self.kinds[0] if len(self.kinds) == 1 else "resource"


def group_kind(nodes: Sequence[NodeSpec], group: NodeGroup, as_nodes: bool = False) -> tuple[str, bool]:
    """``(kind, is_accelerator)`` of the resources ``group`` offers."""
    if as_nodes or group.ignore_hardware:
        return NODE_KIND, False
    if group.hardware_type:
        return group.hardware_type, False
    types = {nodes[rank].accelerator_type for rank in group.node_ranks if nodes[rank].num_accelerators}
    if not types:
        return NODE_KIND, False
    if len(types) > 1:
        raise PlacementError(
            f"node group {group.label!r} mixes accelerator types {sorted(types)}",
            expected="one accelerator type per node group; split the nodes into groups",
        )
    return types.pop(), True


def build_pool(nodes: Sequence[NodeSpec], groups: Sequence[NodeGroup], as_nodes: bool) -> ResourcePool:
    node_of: list[int] = []
    local_of: list[int] = []
    group_of: list[str] = []
    kind_of: list[str] = []
    kinds: list[str] = []
    accelerators: set[str] = set()
    offered_by: dict[tuple[int, str], str] = {}
    for group in groups:
        kind, is_accelerator = group_kind(nodes, group, as_nodes)
        if kind not in kinds:
            kinds.append(kind)
        if is_accelerator:
            accelerators.add(kind)
        for rank in _contributing_nodes(nodes, group, kind, is_accelerator):
            other = offered_by.setdefault((rank, kind), group.label)
            if other != group.label:
                what = "node" if kind == NODE_KIND else f"{kind}s"
                raise PlacementError(
                    f"node {rank}'s {what} are offered by both node groups {other!r} and {group.label!r}",
                    expected="node groups that do not offer the same resources twice in one placement",
                )
        start = len(node_of)
        if kind == NODE_KIND:
            node_of.extend(group.node_ranks)
            local_of.extend([0] * len(group.node_ranks))
        elif not is_accelerator:
            node_of.extend(unit.node_rank for unit in group.hardware)
            local_of.extend(unit.index for unit in group.hardware)
        else:
            for rank in group.node_ranks:
                count = nodes[rank].num_accelerators
                node_of.extend([rank] * count)
                local_of.extend(range(count))
        added = len(node_of) - start
        group_of.extend([group.label] * added)
        kind_of.extend([kind] * added)
    description = "; ".join(_describe(nodes, group, as_nodes) for group in groups)
    return ResourcePool(
        node_of, local_of, group_of, kind_of, tuple(kinds), frozenset(accelerators), nodes, description
    )


def _contributing_nodes(
    nodes: Sequence[NodeSpec], group: NodeGroup, kind: str, is_accelerator: bool
) -> list[int]:
    """The nodes whose resources ``group`` adds to a pool (only they can be offered twice)."""
    if kind == NODE_KIND:
        return list(group.node_ranks)
    if is_accelerator:
        return [rank for rank in group.node_ranks if nodes[rank].num_accelerators]
    return sorted({unit.node_rank for unit in group.hardware})


def _describe(nodes: Sequence[NodeSpec], group: NodeGroup, as_nodes: bool) -> str:
    kind, is_accelerator = group_kind(nodes, group, as_nodes)
    if kind == NODE_KIND:
        count = len(group.node_ranks)
    elif is_accelerator:
        count = sum(nodes[rank].num_accelerators for rank in group.node_ranks)
    else:
        count = len(group.hardware)
    plural = "" if count == 1 else "s"
    return f"node group {group.label!r} has {count} {kind}{plural} on nodes {short_ranks(group.node_ranks)}"
