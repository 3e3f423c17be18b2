"""Numbering the resources a component is placed on.

A node group offers one kind of resource: its declared hardware type if any (robots …), else its
accelerators, else its nodes (``ignore_hardware: true`` and the reserved ``node`` group force
nodes). Resources are numbered node by node in node-rank order, and several groups concatenate in
the order listed. The pool stores flat per-resource arrays so that every lookup afterwards is O(1)
(RLinf re-scans all nodes per process, which is what makes it quadratic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlinfra.placement.errors import PlacementError, short_ranks

if TYPE_CHECKING:
    from rlinfra.placement.cluster_spec import ClusterSpec, NodeGroup

NODE_KIND = "node"


@dataclass(frozen=True, eq=False)
class ResourcePool:
    """Resources ``0..size-1`` of some node groups: for each, its node, node-local index and group."""

    kind: str
    is_accelerator: bool
    node_of: Sequence[int]
    local_of: Sequence[int]
    group_of: Sequence[str]
    description: str

    @property
    def size(self) -> int:
        return len(self.node_of)

    @property
    def is_node(self) -> bool:
        return self.kind == NODE_KIND

    @property
    def unit_name(self) -> str:
        return self.kind if self.size == 1 else f"{self.kind}s"


def group_kind(spec: ClusterSpec, group: NodeGroup, as_nodes: bool = False) -> tuple[str, bool]:
    """``(kind, is_accelerator)`` of the resources ``group`` offers."""
    if as_nodes or group.ignore_hardware:
        return NODE_KIND, False
    if group.hardware_type:
        return group.hardware_type, False
    types = {
        spec.nodes[rank].accelerator_type for rank in group.node_ranks if spec.nodes[rank].num_accelerators
    }
    if not types:
        return NODE_KIND, False
    if len(types) > 1:
        raise PlacementError(
            f"node group {group.label!r} mixes accelerator types {sorted(types)}",
            expected="one accelerator type per node group; split the nodes into groups",
        )
    return types.pop(), True


def build_pool(spec: ClusterSpec, groups: Sequence[NodeGroup], as_nodes: bool) -> ResourcePool:
    kinds = [group_kind(spec, group, as_nodes) for group in groups]
    if len(set(kinds)) > 1:
        listed = ", ".join(f"{g.label!r} ({kind})" for g, (kind, _) in zip(groups, kinds, strict=True))
        raise PlacementError(
            f"node groups offer different kinds of resources: {listed}",
            expected="node groups of one resource kind in one placement",
        )
    kind, is_accelerator = kinds[0]
    owner: dict[int, str] = {}
    node_of: list[int] = []
    local_of: list[int] = []
    group_of: list[str] = []
    for group in groups:
        for rank in group.node_ranks:
            if rank in owner:
                raise PlacementError(
                    f"node {rank} is in both node groups {owner[rank]!r} and {group.label!r}",
                    expected="node groups without shared nodes in one placement",
                )
            owner[rank] = group.label
        if kind == NODE_KIND:
            node_of.extend(group.node_ranks)
            local_of.extend([0] * len(group.node_ranks))
            group_of.extend([group.label] * len(group.node_ranks))
        elif not is_accelerator:
            node_of.extend(unit.node_rank for unit in group.hardware)
            local_of.extend(unit.index for unit in group.hardware)
            group_of.extend([group.label] * len(group.hardware))
        else:
            for rank in group.node_ranks:
                count = spec.nodes[rank].num_accelerators
                node_of.extend([rank] * count)
                local_of.extend(range(count))
                group_of.extend([group.label] * count)
    description = "; ".join(_describe(spec, group, kind, is_accelerator) for group in groups)
    return ResourcePool(kind, is_accelerator, node_of, local_of, group_of, description)


def _describe(spec: ClusterSpec, group: NodeGroup, kind: str, is_accelerator: bool) -> str:
    if kind == NODE_KIND:
        count = len(group.node_ranks)
    elif is_accelerator:
        count = sum(spec.nodes[rank].num_accelerators for rank in group.node_ranks)
    else:
        count = len(group.hardware)
    plural = "" if count == 1 else "s"
    return f"node group {group.label!r} has {count} {kind}{plural} on nodes {short_ranks(group.node_ranks)}"
