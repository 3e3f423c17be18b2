"""Placement strategies: a recipe that, given a cluster, yields one ``Placement`` per process.

Three recipes, as in RLinf, with one shared builder underneath:

* ``FlexiblePlacementStrategy`` — an explicit list of resource ranks per process;
* ``NodePlacementStrategy`` — one node per process (processes may repeat a node);
* ``PackedPlacementStrategy`` — a contiguous device range cut into equal, optionally strided,
  chunks.

All of them raise ``PlacementError`` (never ``IndexError``) when the cluster cannot honour them,
e.g. a packed chunk that would straddle two nodes — RLinf silently hands out a device past the
node's end there. Strategies made by ``ComponentPlacement`` were already checked at parse time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlinfra.placement.cluster_spec import ClusterSpec
from rlinfra.placement.constraints import NO_CONSTRAINTS, Constraints
from rlinfra.placement.env_vars import NO_ENV_VARS, EnvVars
from rlinfra.placement.errors import PlacementError, short_ranks
from rlinfra.placement.gc_pause import gc_paused
from rlinfra.placement.node_groups import CLUSTER_GROUP, NODE_GROUP, NODE_KIND, NodeSpec
from rlinfra.placement.record import Placement
from rlinfra.placement.resources import ResourcePool
from rlinfra.placement.restart import RestartPolicy


def as_cluster_spec(cluster: Any) -> ClusterSpec:
    """Accept a ``ClusterSpec`` or anything carrying one as ``.spec`` (the live ``Cluster``)."""
    if isinstance(cluster, ClusterSpec):
        return cluster
    spec = getattr(cluster, "spec", None)
    if isinstance(spec, ClusterSpec):
        return spec
    raise PlacementError(
        f"expected a ClusterSpec or a Cluster, got {type(cluster).__name__}",
        expected="ClusterSpec.from_config(cfg.cluster) for a dry run, or rlinfra.Cluster",
    )


def _labels(node_group: str | Sequence[str] | None, default: str) -> tuple[str, ...]:
    """RLinf's ``node_group_label`` / ``node_group``: None (the default group), one label, a
    comma-separated string, or a sequence of labels (YAML ints are labels too)."""
    if node_group is None:
        return (default,)
    if isinstance(node_group, int) and not isinstance(node_group, bool):
        node_group = str(node_group)
    if isinstance(node_group, str):
        labels = tuple(label.strip() for label in node_group.split(","))
    elif isinstance(node_group, (list, tuple)):
        labels = tuple(str(label).strip() for label in node_group)
    else:
        raise PlacementError(f"bad node group {node_group!r}", expected="a label or a list of labels")
    if not labels or any(not label for label in labels):
        raise PlacementError(f"bad node group {node_group!r}", expected="one or more labels")
    return labels


class PlacementStrategy:
    """Base class: subclasses say which resources each process gets; this class builds records.

    ``env_vars``, ``constraints``, ``num_cpus`` and ``restart`` are the component's own, set by
    ``ComponentPlacement`` from the config (a strategy built by hand has none: no variables, no
    constraints, the default CPU rule and restart budget).
    """

    as_nodes = False
    env_vars: EnvVars = NO_ENV_VARS
    constraints: Constraints = NO_CONSTRAINTS
    num_cpus: float | None = None
    restart: RestartPolicy | None = None

    def __init__(self, node_groups: tuple[str, ...], where: str) -> None:
        self.node_groups = node_groups
        self.where = where
        self._cached: tuple[ClusterSpec, bool, list[Placement]] | None = None

    def process_resources(self, pool: ResourcePool) -> Sequence[tuple[int, ...]]:
        raise NotImplementedError

    @property
    def world_size(self) -> int:
        raise NotImplementedError

    def get_placement(self, cluster: Any, isolate_accelerator: bool = True) -> list[Placement]:
        """One ``Placement`` per process, in rank order. Deterministic for a given cluster."""
        spec = as_cluster_spec(cluster)
        cached = self._cached
        if cached is not None and cached[0] is spec and cached[1] == isolate_accelerator:
            return list(cached[2])
        try:
            pool = spec.resources(self.node_groups, as_nodes=self.as_nodes)
        except PlacementError as error:
            raise error.within(self.where) from None
        placements = build_placements(pool, self.process_resources(pool), isolate_accelerator, self.where)
        self._cached = (spec, isolate_accelerator, placements)
        return list(placements)


class FlexiblePlacementStrategy(PlacementStrategy):
    """Process ``i`` uses resources ``hardware_ranks_list[i]`` of ``node_group_label`` (all on one
    node, all of one kind); without a label, of the whole cluster's accelerators.

    As in RLinf, each process's ranks are sorted, and processes are ordered by their first rank
    (``[[2, 1, 3]]`` uses 1,2,3; ``[[4], [0]]`` puts rank 0 on resource 0). Several processes may
    list the same device (they share it).
    """

    def __init__(
        self,
        hardware_ranks_list: Sequence[Sequence[int]],
        node_group_label: str | Sequence[str] | None = None,
    ) -> None:
        where = type(self).__name__
        super().__init__(_labels(node_group_label, self._default_group()), where)
        checked = _checked_ranks_list(hardware_ranks_list, where)
        self._ranks_list = sorted((tuple(sorted(ranks)) for ranks in checked), key=lambda ranks: ranks[0])

    @staticmethod
    def _default_group() -> str:
        return CLUSTER_GROUP

    @classmethod
    def from_checked_ranks(
        cls, ranks_list: list[tuple[int, ...]], node_groups: tuple[str, ...], where: str
    ) -> FlexiblePlacementStrategy:
        """A strategy from ranks the mapping stage already checked and ordered (no re-validation;
        ``where`` names the config entry in later errors)."""
        strategy = cls.__new__(cls)
        PlacementStrategy.__init__(strategy, node_groups, where)
        strategy._ranks_list = ranks_list
        return strategy

    @property
    def world_size(self) -> int:
        return len(self._ranks_list)

    def process_resources(self, pool: ResourcePool) -> Sequence[tuple[int, ...]]:
        return self._ranks_list


def _checked_ranks_list(hardware_ranks_list: Sequence[Sequence[int]], where: str) -> list[tuple[int, ...]]:
    if not _is_sequence(hardware_ranks_list) or not hardware_ranks_list:
        raise PlacementError(
            f"no processes in {hardware_ranks_list!r}", where=where, expected="at least one list of ranks"
        )
    ranks_list: list[tuple[int, ...]] = []
    for index, raw in enumerate(hardware_ranks_list):
        ranks = tuple(raw) if _is_sequence(raw) else ()
        if not ranks or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks):
            raise PlacementError(
                f"process {index} has resource ranks {raw!r}",
                where=where,
                expected="a non-empty list of non-negative ints per process",
            )
        if len(set(ranks)) != len(ranks):
            raise PlacementError(
                f"process {index} lists a resource twice: {list(ranks)!r}",
                where=where,
                expected="each resource once per process",
            )
        ranks_list.append(ranks)
    return ranks_list


def _is_sequence(value: object) -> bool:
    """A list-like of ranks (a string is a sequence too, but never one of ranks)."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


class NodePlacementStrategy(FlexiblePlacementStrategy):
    """Process ``i`` runs on node ``sorted(node_ranks)[i]``: without a label, a cluster node rank;
    with ``node_group_label``, a rank among the nodes of those groups (as in RLinf). Repeat a node
    to run several processes on it."""

    as_nodes = True

    def __init__(
        self, node_ranks: Sequence[int], node_group_label: str | Sequence[str] | None = None
    ) -> None:
        if not _is_sequence(node_ranks):
            raise PlacementError(
                f"node ranks {node_ranks!r}", where=type(self).__name__, expected="a list of node ranks"
            )
        super().__init__([(rank,) for rank in node_ranks], node_group_label)

    @staticmethod
    def _default_group() -> str:
        return NODE_GROUP


class PackedPlacementStrategy(FlexiblePlacementStrategy):
    """Devices ``start..end`` of ``node_group`` (default: the whole cluster's accelerators) cut
    into chunks of ``num_hardware_per_process``.

    With ``stride`` s > 1, each block of ``num * s`` consecutive devices holds s processes that
    interleave: process j of a block gets devices ``base + j, base + j + s, …``. A chunk never
    straddles two nodes (RLinf hands out a device past the node's end there).
    """

    def __init__(
        self,
        start_hardware_rank: int,
        end_hardware_rank: int,
        num_hardware_per_process: int = 1,
        stride: int = 1,
        node_group: str | Sequence[str] | None = None,
    ) -> None:
        where = type(self).__name__
        for name, value, minimum in (
            ("start_hardware_rank", start_hardware_rank, 0),
            ("end_hardware_rank", end_hardware_rank, 0),
            ("num_hardware_per_process", num_hardware_per_process, 1),
            ("stride", stride, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise PlacementError(f"{name} is {value!r}", where=where, expected=f"an int >= {minimum}")
        if end_hardware_rank < start_hardware_rank:
            raise PlacementError(
                f"end_hardware_rank {end_hardware_rank} < start_hardware_rank {start_hardware_rank}",
                where=where,
                expected="start <= end (both inclusive)",
            )
        block = num_hardware_per_process * stride
        count = end_hardware_rank - start_hardware_rank + 1
        if count % block:
            raise PlacementError(
                f"{count} devices do not split into blocks of {num_hardware_per_process} x stride {stride}",
                where=where,
                expected=f"a device range whose length is a multiple of {block}",
            )
        ranks_list = [
            tuple(base + offset + k * stride for k in range(num_hardware_per_process))
            for base in range(start_hardware_rank, end_hardware_rank + 1, block)
            for offset in range(stride)
        ]
        super().__init__(ranks_list, node_group)


# ``Placement(field=...)`` binds keywords in a Python-level ``__new__``, several times the cost of
# the tuple itself (most of the build at 8,000 processes): records are made positionally, in the
# order of ``Placement._fields``.
_new_placement = tuple.__new__


def build_placements(
    pool: ResourcePool,
    process_resources: Sequence[tuple[int, ...]],
    isolate_accelerator: bool,
    where: str,
) -> list[Placement]:
    """The shared, linear-time builder behind every strategy (a hot path: 32,000 processes on a
    4,000-node plan, so it avoids per-process attribute lookups and function calls)."""
    with gc_paused():
        return _build(pool, process_resources, isolate_accelerator, where)


def _build(
    pool: ResourcePool,
    process_resources: Sequence[tuple[int, ...]],
    isolate_accelerator: bool,
    where: str,
) -> list[Placement]:
    node_of, group_of, kind_of = pool.node_of, pool.group_of, pool.kind_of
    _check_resources(pool, process_resources, where)
    nodes = [node_of[resources[0]] for resources in process_resources]
    per_node_count: dict[int, int] = {}
    node_order: dict[int, int] = {}
    local_ranks: list[int] = []
    for node in nodes:
        count = per_node_count.get(node)
        if count is None:
            count = 0
            node_order[node] = len(node_order)
        local_ranks.append(count)
        per_node_count[node] = count + 1

    world_size = len(process_resources)
    local_of, node_specs, accelerator_kinds = pool.local_of, pool.nodes, pool.accelerator_kinds
    # Thousands of processes share a few dozen distinct device answers: compute each once.
    devices: dict[tuple[str, int, str, tuple[int, ...]], tuple[str | None, int, tuple[str, ...]]] = {}
    placements: list[Placement] = []
    append = placements.append
    for rank, (resources, node, local_rank) in enumerate(
        zip(process_resources, nodes, local_ranks, strict=True)
    ):
        first = resources[0]
        kind = kind_of[first]
        if kind == NODE_KIND:
            local_ids: tuple[int, ...] = ()
        elif len(resources) == 1:
            local_ids = (local_of[first],)
        else:
            local_ids = tuple(local_of[r] for r in resources)
        spec = node_specs[node]
        key = (kind, spec.num_accelerators, spec.accelerator_type, local_ids)
        found = devices.get(key)
        if found is None:
            isolated = isolate_accelerator and kind in accelerator_kinds
            found = devices[key] = _visible(spec, local_ids, isolated)
        accelerator_type, local_accelerator_rank, visible = found
        append(
            _new_placement(
                Placement,
                (
                    rank,
                    world_size,
                    node,
                    node_order[node],
                    local_rank,
                    per_node_count[node],
                    accelerator_type,
                    local_accelerator_rank,
                    [*visible],
                    isolate_accelerator,
                    kind,
                    [*resources],
                    [*local_ids],
                    group_of[first],
                ),
            )
        )
    return placements


def _visible(
    node: NodeSpec, local_ids: tuple[int, ...], isolated: bool
) -> tuple[str | None, int, tuple[str, ...]]:
    """The node's accelerator type, and the accelerators a process sees with their first (-1 for
    none): its own when it is isolated on accelerators, else all of its node's, as in RLinf."""
    accelerator_type = node.accelerator_type if node.num_accelerators else None
    shown = local_ids if isolated else tuple(range(node.num_accelerators))
    return accelerator_type, shown[0] if shown else -1, tuple(map(str, shown))


def _check_resources(pool: ResourcePool, process_resources: Sequence[tuple[int, ...]], where: str) -> None:
    """Every resource exists and each process's resources share one node."""
    node_of, kind_of, size = pool.node_of, pool.kind_of, pool.size
    for rank, resources in enumerate(process_resources):
        if len(resources) == 1:
            if resources[0] < size:
                continue
        elif (
            max(resources) < size
            and len({node_of[r] for r in resources}) == 1
            and len({kind_of[r] for r in resources}) == 1
        ):
            continue
        missing = [r for r in resources if r >= size]
        if missing:
            raise PlacementError(
                f"process {rank} asks for {pool.kind} {missing[0]}, which does not exist: {pool.description}",
                where=where,
                expected=f"{pool.kind} ranks within 0-{size - 1}",
            )
        spanned = sorted({node_of[r] for r in resources})
        if len(spanned) == 1:
            raise PlacementError(
                f"process {rank} would own resources of different kinds "
                f"({', '.join(sorted({kind_of[r] for r in resources}))})",
                where=where,
                expected="the resources of one process of one kind",
            )
        raise PlacementError(
            f"process {rank} would span nodes {spanned[0]} and {spanned[1]} "
            f"({pool.kind}s {short_ranks(sorted(resources))})",
            where=where,
            expected=f"the {pool.kind}s of one process on one node",
        )
