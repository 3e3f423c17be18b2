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

from collections import Counter
from collections.abc import Sequence
from typing import Any

from rlinfra.placement.cluster_spec import ClusterSpec
from rlinfra.placement.config_access import name_list
from rlinfra.placement.constraints import NO_CONSTRAINTS, Constraints
from rlinfra.placement.env_vars import NO_ENV_VARS, EnvVars
from rlinfra.placement.errors import PlacementError
from rlinfra.placement.gc_pause import gc_paused
from rlinfra.placement.node_groups import CLUSTER_GROUP, NODE_GROUP, NODE_KIND, NodeSpec
from rlinfra.placement.record import Placement
from rlinfra.placement.resources import ResourcePool
from rlinfra.placement.restart import RestartPolicy


def as_cluster_spec(cluster: Any) -> ClusterSpec:
    """Accept a ``ClusterSpec`` or anything carrying one as ``.spec`` (the live ``Cluster``)."""
    spec = cluster if isinstance(cluster, ClusterSpec) else getattr(cluster, "spec", None)
    if not isinstance(spec, ClusterSpec):
        raise PlacementError(
            f"expected a ClusterSpec or a Cluster, got {type(cluster).__name__}",
            expected="ClusterSpec.from_config(cfg.cluster) for a dry run, or rlinfra.Cluster",
        )
    return spec


class PlacementStrategy:
    """The resources of each process (one tuple of resource ranks per process, in rank order, as
    checked by the subclass or the mapping stage), and the records built from them.

    ``env_vars``, ``constraints``, ``num_cpus`` and ``restart`` are the component's own, set by
    ``ComponentPlacement`` from the config (a strategy built by hand has none: no variables, no
    constraints, the default CPU rule and restart budget).
    """

    as_nodes = False
    default_group = CLUSTER_GROUP  # of a strategy built without a node group
    env_vars: EnvVars = NO_ENV_VARS
    constraints: Constraints = NO_CONSTRAINTS
    num_cpus: float | None = None
    restart: RestartPolicy | None = None

    def __init__(self, ranks_list: list[tuple[int, ...]], node_groups: tuple[str, ...], where: str) -> None:
        self.node_groups = node_groups
        self.where = where  # names the strategy or the config entry in later errors
        self._ranks_list = ranks_list
        self._cached: tuple[ClusterSpec, bool, list[Placement]] | None = None

    @property
    def world_size(self) -> int:
        return len(self._ranks_list)

    def get_placement(self, cluster: Any, isolate_accelerator: bool = True) -> list[Placement]:
        """One ``Placement`` per process, in rank order. Deterministic for a given cluster."""
        spec = as_cluster_spec(cluster)
        cached = self._cached
        if cached is not None and cached[0] is spec and cached[1] == isolate_accelerator:
            return list(cached[2])
        pool = spec.resources(self.node_groups, as_nodes=self.as_nodes, where=self.where)
        placements = build_placements(pool, self._ranks_list, isolate_accelerator, self.where)
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
        labels = name_list(
            self.default_group if node_group_label is None else node_group_label, where, "node group label"
        )
        checked = _checked_ranks_list(hardware_ranks_list, where)
        ranks_list = sorted((tuple(sorted(ranks)) for ranks in checked), key=lambda ranks: ranks[0])
        super().__init__(ranks_list, labels, where)

    @classmethod
    def from_checked_ranks(
        cls, ranks_list: list[tuple[int, ...]], node_groups: tuple[str, ...], where: str
    ) -> FlexiblePlacementStrategy:
        """A strategy from ranks the mapping stage already checked and ordered (no re-validation)."""
        strategy = cls.__new__(cls)
        PlacementStrategy.__init__(strategy, ranks_list, node_groups, where)
        return strategy


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
    default_group = NODE_GROUP

    def __init__(
        self, node_ranks: Sequence[int], node_group_label: str | Sequence[str] | None = None
    ) -> None:
        if not _is_sequence(node_ranks):
            raise PlacementError(
                f"node ranks {node_ranks!r}", where=type(self).__name__, expected="a list of node ranks"
            )
        super().__init__([(rank,) for rank in node_ranks], node_group_label)


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


@gc_paused()
def build_placements(
    pool: ResourcePool, process_resources: Sequence[tuple[int, ...]], isolate_accelerator: bool, where: str
) -> list[Placement]:
    """The shared, linear-time builder behind every strategy (a hot path: 32,000 processes on a
    4,000-node plan, so it avoids per-process attribute lookups and function calls)."""
    problem = pool.first_problem(process_resources)
    if problem is not None:
        raise PlacementError(problem[0], where=where, expected=problem[1])
    node_of, group_of, kind_of, local_of = pool.node_of, pool.group_of, pool.kind_of, pool.local_of
    nodes = [node_of[resources[0]] for resources in process_resources]
    per_node_count = dict(Counter(nodes))  # in order of first use; a plain dict reads faster
    node_order = {node: index for index, node in enumerate(per_node_count)}
    next_local_rank = dict.fromkeys(per_node_count, 0)
    world_size = len(process_resources)
    node_specs, accelerator_kinds = pool.nodes, pool.accelerator_kinds
    # Thousands of processes share a few dozen distinct device answers: compute each once.
    devices: dict[tuple[str, int, str, tuple[int, ...]], tuple[str | None, int, tuple[str, ...]]] = {}
    placements: list[Placement] = []
    append = placements.append
    for rank, (resources, node) in enumerate(zip(process_resources, nodes, strict=True)):
        local_rank = next_local_rank[node]
        next_local_rank[node] = local_rank + 1
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
