"""``Layout``: a job's resources reserved as one placement group, split among its components.

The slime-style core: one placement group for the job, each component launched into its slice of
the (node rank, device)-ordered bundles — colocated components share bundles with fractional
reservations, disaggregated ones use disjoint bundles. The table itself is computed without Ray
(``rlinfra.runtime.bundles.plan_layout``); this module reserves it, with a deadline. It is the only
reservation path: a group launched without a layout reserves a one-component layout of its own.

    with Layout(cluster, placement, ["actor", "rollout"]) as layout:
        actor = Trainer.create_group().launch(cluster, placement.get_strategy("actor"),
                                              name="actor", layout=layout)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from rlinfra.placement.constraints import NODE_ID_LABEL, Constraints, process_constraints
from rlinfra.placement.record import VISIBILITY_ENV, Placement
from rlinfra.placement.strategies import PlacementStrategy
from rlinfra.runtime.bundles import ActorReservation, LayoutPlan, plan_layout
from rlinfra.runtime.cluster import Cluster
from rlinfra.runtime.errors import ClusterError
from rlinfra.runtime.topology import BundleNode, check_constraints, describe_constraints

DEFAULT_RESERVE_TIMEOUT_S = 120.0


class ReservationError(ClusterError):
    """Ray could not reserve a placement group before the deadline; says what is missing where."""


class Layout:
    """One placement group holding several components' resources (release it when done)."""

    def __init__(
        self,
        cluster: Cluster,
        placement: Any,
        components: Sequence[str] | None = None,
        *,
        num_cpus: float | None = None,
        isolate_accelerator: bool = True,
        timeout: float = DEFAULT_RESERVE_TIMEOUT_S,
        what: str | None = None,
    ) -> None:
        """Plan each component's slice from its strategy (placements, per-process constraints,
        CPUs) and reserve the whole as one placement group.

        ``placement`` is a ``ComponentPlacement`` (``components``: which of its components,
        default all) or a mapping component → ``PlacementStrategy`` — what a ``WorkerGroup``
        launched without a layout reserves for itself. Errors call the layout ``what`` (default
        ``layout <components>``).
        """
        strategies = _strategies(placement, components)
        groups = {label: group.constraints for label, group in cluster.spec.node_groups.items()}
        self.placements: dict[str, list[Placement]] = {}
        self.constraints: dict[str, list[Constraints]] = {}
        self.num_cpus: dict[str, float | None] = {}
        for name, strategy in strategies.items():
            self.placements[name] = strategy.get_placement(cluster, isolate_accelerator)
            self.constraints[name] = process_constraints(self.placements[name], strategy.constraints, groups)
            self.num_cpus[name] = cpus_per_process(name, num_cpus, strategy.num_cpus)
        node_resources = {node.rank: node.resources for node in cluster.nodes}
        self.plan: LayoutPlan = plan_layout(self.placements, self.num_cpus, node_resources, self.constraints)
        self.cluster = cluster
        self.pg: PlacementGroup | None = self._reserve(timeout, what or "layout " + ",".join(strategies))

    def _reserve(self, timeout: float, what: str) -> PlacementGroup:
        """Create the placement group with every bundle pinned to its node, and wait for it.

        Ray waits forever for a feasible-but-busy reservation, for more than a node has in all, and
        for a custom resource or node label no node has. The last two fail at once
        (``ReservationError`` from ``check_capacity``, ``TopologyError``, from the nodes' totals and
        labels); a busy reservation gives up at ``timeout``, removes the request and raises
        ``ReservationError`` naming what each node lacks and the constraints in force.
        """
        plan, cluster = self.plan, self.cluster
        check_constraints(plan, self.constraints, cluster.nodes)
        check_capacity(plan, cluster, what)
        selectors = [
            {**extra, NODE_ID_LABEL: cluster.node(node).node_id}
            for node, extra in zip(plan.bundle_nodes, plan.bundle_labels, strict=True)
        ]
        pg = placement_group(plan.bundles, strategy="PACK", bundle_label_selector=selectors)
        ready, _ = ray.wait([pg.ready()], timeout=timeout)
        if not ready:
            remove_placement_group(pg)
            in_force = describe_constraints(self.constraints)
            raise ReservationError(f"{what}: {missing_resources(plan, cluster, timeout)}{in_force}")
        return pg

    def slot(
        self, component: str, placements: Sequence[Placement], num_cpus: float | None = None
    ) -> tuple[Any, list[ActorReservation]]:
        """The placement group and reservations for ``component``, checking that the group being
        launched has exactly the placements (and, when given, the CPUs per process) this layout
        was planned for."""
        if self.pg is None:
            raise ClusterError("this layout was released; create a new one")
        if component not in self.placements:
            raise ClusterError(
                f"component {component!r} is not in this layout (it holds {', '.join(self.placements)})"
            )
        if list(placements) != self.placements[component]:
            message = (
                "is launched with other placements (strategy, isolate_accelerator) than the layout planned"
            )
            raise ClusterError(f"component {component!r} {message}")
        planned = self.num_cpus[component]
        if num_cpus is not None and num_cpus != planned:
            reserved = "the default rule" if planned is None else f"num_cpus={planned:g}"
            raise ClusterError(
                f"component {component!r} is launched with num_cpus={num_cpus:g}, but the layout reserved "
                f"{reserved}; pass num_cpus to Layout instead"
            )
        return self.pg, self.plan.reservations[component]

    def release(self) -> None:
        """Give the placement group back to Ray. Safe to call twice."""
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None

    def bundle_report(self, component: str) -> list[BundleNode]:
        """Each rank of ``component``: its bundle, the node planned and the node Ray reports
        (``placement_group_table``'s bundle → node id; none once the layout is released)."""
        table = ray.util.placement_group_table(self.pg) if self.pg is not None else {}
        placed = {int(index): node_id for index, node_id in table.get("bundles_to_node_id", {}).items()}
        rank_of = {node.node_id: node.rank for node in self.cluster.nodes}
        report = []
        for rank, row in enumerate(self.plan.reservations[component]):
            node_id = placed.get(row.bundle_index, "")
            planned = self.plan.bundle_nodes[row.bundle_index]
            report.append(BundleNode(rank, row.bundle_index, planned, rank_of.get(node_id), node_id))
        return report

    def __enter__(self) -> Layout:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def cpus_per_process(component: str, given: float | None, configured: float | None) -> float | None:
    """The CPUs each process of ``component`` reserves: what the code passed, else the YAML's
    ``num_cpus``, else None (the default rule). Two different values are refused, so neither is
    silently ignored."""
    if given is not None and configured is not None and given != configured:
        raise ClusterError(
            f"component {component!r}: num_cpus={given:g} is passed in code but the config says "
            f"num_cpus: {configured:g}; give it in one place"
        )
    return given if given is not None else configured


def _strategies(placement: Any, components: Sequence[str] | None) -> dict[str, PlacementStrategy]:
    if isinstance(placement, Mapping):
        return dict(placement)
    names = components if components is not None else placement.components
    return {name: placement.get_strategy(name) for name in names}


def check_capacity(plan: LayoutPlan, cluster: Cluster, what: str) -> None:
    """Refuse at once what no waiting could give: more CPUs, GPUs or other resources on a node
    than the node has in total (bundles are pinned to their nodes, so this covers the cluster's
    total too). Resources Ray does not track on any node (robots without a Ray resource) are
    only counted through their CPUs."""
    short = []
    for node, wanted in sorted(plan.per_node().items()):
        totals = cluster.node(node).resources
        for name, amount in sorted(wanted.items()):
            have, gap = totals.get(name, 0.0), amount - totals.get(name, 0.0)
            if gap > 1e-9:
                short.append(
                    f"\n    node {node}: {name}={amount:g} requested, {have:g} in total (short by {gap:g})"
                )
    if short:
        raise ReservationError(
            f"{what}: the reservation can never fit, whatever else finishes:{''.join(short)}\n  lower "
            "num_cpus for the components on those nodes (see `rlinfra plan --cpus`), or use larger nodes"
        )


def missing_resources(plan: LayoutPlan, cluster: Cluster, timeout: float) -> str:
    """Requested vs available resources per node, and the difference."""
    try:
        available = ray._private.state.available_resources_per_node()
    except Exception:  # best effort diagnostics only
        available = {}
    lines = [f"Ray could not reserve the placement group within {timeout:g} s; per node:"]
    for node, wanted in sorted(plan.per_node().items()):
        have = available.get(cluster.node(node).node_id, {})
        parts = []
        for name, amount in sorted(wanted.items()):
            free = have.get(name, 0.0)
            short = f" (short by {amount - free:g})" if free + 1e-9 < amount else ""
            parts.append(f"{name}={amount:g} requested, {free:g} free{short}")
        lines.append(f"    node {node}: " + "; ".join(parts))
    shown = ", ".join(sorted({"CPU", "GPU", *VISIBILITY_ENV} & {k for r in plan.bundles for k in r}))
    lines.append(f"  (resources: {shown}; other jobs or groups may hold the rest)")
    return "\n".join(lines)
