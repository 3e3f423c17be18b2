"""Numbering the resources a component is placed on.

A node group offers one kind of resource: its declared hardware type if any (robots …), else its
accelerators, else its nodes (``ignore_hardware: true`` and the reserved ``node`` group force
nodes). Resources are numbered node by node in node-rank order, and several groups concatenate in
the order listed — also groups of different kinds (GPUs, then robots, as RLinf allows) and groups
that share a node, as long as no resource is offered twice. Each resource keeps its own kind. The
pool stores flat per-resource arrays so that every lookup afterwards is O(1) (RLinf re-scans all
nodes per process, which is what makes it quadratic).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from rlinfra.placement.errors import PlacementError, plural, short_ranks
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

    def first_problem(
        self, process_resources: Sequence[Sequence[int]], first_rank: int = 0
    ) -> tuple[str, str] | None:
        """Why the first process that cannot own its resources (one does not exist, they span two
        nodes, or they are of two kinds) cannot, and what was expected; None when all can. A hot
        path (thousands of processes per call), so the valid case stays cheap."""
        # Bound lookups, mapped in C: the multi-resource check costs two small sets per process.
        node_at, kind_at, size = self.node_of.__getitem__, self.kind_of.__getitem__, self.size
        for rank, resources in enumerate(process_resources, first_rank):
            if len(resources) == 1:
                if resources[0] < size:
                    continue
            elif (
                max(resources) < size
                and len(set(map(node_at, resources))) == 1
                and len(set(map(kind_at, resources))) == 1
            ):
                continue
            return self._problem(rank, resources)
        return None

    def _problem(self, rank: int, resources: Sequence[int]) -> tuple[str, str]:
        missing = [r for r in resources if r >= self.size]
        if missing:
            return (
                f"process {rank} asks for {self.kind} {missing[0]}, which does not exist: {self.description}",
                f"{self.kind} ranks within 0-{self.size - 1}",
            )
        nodes = list(dict.fromkeys(self.node_of[r] for r in resources))  # in resource order
        if len(nodes) > 1:
            return (
                f"process {rank} would span nodes {nodes[0]} and {nodes[1]} "
                f"({self.kind}s {short_ranks(sorted(resources))})",
                f"the {self.kind}s of one process on one node",
            )
        return (
            f"process {rank} would own resources {short_ranks(sorted(resources))} of different kinds "
            f"({', '.join(sorted({self.kind_of[r] for r in resources}))})",
            "the resources of one process of one kind",
        )


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
    described: list[str] = []
    for group in groups:
        kind, is_accelerator = group_kind(nodes, group, as_nodes)
        if kind not in kinds:
            kinds.append(kind)
        if is_accelerator:
            accelerators.add(kind)
        group_nodes, group_locals = _numbered(nodes, group, kind, is_accelerator)
        # Only several groups can offer a resource twice; with one, skip the check (a hot path).
        for rank in dict.fromkeys(group_nodes) if len(groups) > 1 else {}:
            other = offered_by.setdefault((rank, kind), group.label)
            if other != group.label:
                what = "node" if kind == NODE_KIND else f"{kind}s"
                raise PlacementError(
                    f"node {rank}'s {what} are offered by both node groups {other!r} and {group.label!r}",
                    expected="node groups that do not offer the same resources twice in one placement",
                )
        node_of.extend(group_nodes)
        local_of.extend(group_locals)
        group_of.extend([group.label] * len(group_nodes))
        kind_of.extend([kind] * len(group_nodes))
        described.append(
            f"node group {group.label!r} has {plural(len(group_nodes), kind)} "
            f"on nodes {short_ranks(group.node_ranks)}"
        )
    description = "; ".join(described)
    return ResourcePool(
        node_of, local_of, group_of, kind_of, tuple(kinds), frozenset(accelerators), nodes, description
    )


def _numbered(
    nodes: Sequence[NodeSpec], group: NodeGroup, kind: str, is_accelerator: bool
) -> tuple[list[int], list[int]]:
    """The node and the node-local index of each resource ``group`` offers, in order."""
    if kind == NODE_KIND:
        return list(group.node_ranks), [0] * len(group.node_ranks)
    if not is_accelerator:
        return [unit.node_rank for unit in group.hardware], [unit.index for unit in group.hardware]
    counts = [(rank, nodes[rank].num_accelerators) for rank in group.node_ranks]
    node_of = [rank for rank, count in counts for _ in range(count)]
    return node_of, [index for _, count in counts for index in range(count)]
