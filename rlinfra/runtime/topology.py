"""Topology constraints against the live cluster: refuse what no node offers, report where bundles went.

Ray waits forever for a bundle that asks for a custom resource or a node label its node lacks,
so before reserving, every constraint is compared with what each node advertises (its total
resources and labels, from discovery): what no amount of waiting can satisfy fails at once,
naming the constraint, the nodes that lack it and the nodes that have it. What is feasible but
busy is left to the reservation deadline (``rlinfra.runtime.layout.Layout``), whose message
then names the constraints too.

After reservation, ``Layout.bundle_report`` reads Ray's own answer (``placement_group_table``'s
bundle → node id) and sets it beside the plan (a ``BundleNode`` per rank), so a report shows where
each rank's bundle really is.

Pure functions over plain data (no Ray import); the runtime calls them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from rlinfra.placement.constraints import Constraints
from rlinfra.placement.errors import short_ranks
from rlinfra.runtime.bundles import LayoutPlan
from rlinfra.runtime.errors import ClusterError

_EPSILON = 1e-9
_SHOWN_NODES = 8


class TopologyError(ClusterError):
    """A topology constraint that no node of the cluster can satisfy."""


class BundleNode(NamedTuple):
    """Where one rank's bundle is: as planned (``planned_node_rank``) and as Ray placed it."""

    rank: int
    bundle_index: int
    planned_node_rank: int
    node_rank: int | None
    node_id: str

    @property
    def matches(self) -> bool:
        return self.node_rank == self.planned_node_rank


def check_constraints(
    plan: LayoutPlan, constraints: Mapping[str, Sequence[Constraints]], nodes: Sequence[Any]
) -> None:
    """Raise ``TopologyError`` if a constraint asks a node for a custom resource it does not have
    (in the total the plan puts on that node) or a label it does not carry.

    ``constraints`` maps component → one ``Constraints`` per rank (as given to ``plan_layout``);
    ``nodes`` are the cluster's nodes by rank, each with ``.resources`` and ``.labels``.
    """
    per_node = plan.per_node()
    problems: list[str] = []
    for component, per_rank in constraints.items():
        resources: dict[str, set[int]] = {}  # what the component asks for → the nodes it asks on
        labels: dict[tuple[str, str], set[int]] = {}
        for row, process in zip(plan.reservations[component], per_rank, strict=True):
            node = plan.bundle_nodes[row.bundle_index]
            for name, _ in process.resources:
                resources.setdefault(name, set()).add(node)
            for label in process.labels:
                labels.setdefault(label, set()).add(node)
        amounts = {name: amount for process in per_rank for name, amount in process.resources}
        for name, node_ranks in resources.items():
            problems += _resource_problem(component, name, amounts[name], node_ranks, per_node, nodes)
        for label, node_ranks in labels.items():
            problems += _label_problem(component, label, node_ranks, nodes)
    if problems:
        raise TopologyError(
            "the topology constraints cannot be met on this cluster (Ray would wait forever):\n"
            + "\n".join(f"  {problem}" for problem in problems)
        )


def _resource_problem(
    component: str,
    name: str,
    amount: float,
    node_ranks: set[int],
    per_node: Mapping[int, Mapping[str, float]],
    nodes: Sequence[Any],
) -> list[str]:
    lacking = []
    for rank in sorted(node_ranks):
        have, need = nodes[rank].resources.get(name, 0.0), per_node.get(rank, {}).get(name, 0.0)
        if have + _EPSILON < need:
            lacking.append(f"node {rank} has {have:g}, needs {need:g}")
    having = [node.rank for node in nodes if node.resources.get(name, 0.0) > 0]
    return _problem(component, f"resource {name}={amount:g} per process", lacking, name, having)


def _label_problem(
    component: str, label: tuple[str, str], node_ranks: set[int], nodes: Sequence[Any]
) -> list[str]:
    key, value = label
    lacking = []
    for rank in sorted(node_ranks):
        actual = nodes[rank].labels.get(key)
        if actual != value:
            has = f"{key}={actual}" if actual is not None else f"no {key!r} label"
            lacking.append(f"node {rank} has {has}")
    having = [node.rank for node in nodes if node.labels.get(key) == value]
    return _problem(component, f"node label {key}={value}", lacking, f"{key}={value}", having)


def _problem(component: str, wanted: str, lacking: list[str], offered: str, having: list[int]) -> list[str]:
    """The problem line for ``component``, if any node lacks what it needs (at most a few named)."""
    if not lacking:
        return []
    shown = ", ".join(lacking[:_SHOWN_NODES])
    more = f", … ({len(lacking)} nodes)" if len(lacking) > _SHOWN_NODES else ""
    offering = f"nodes with {offered}: {short_ranks(having)}"
    return [f"component {component!r} requires {wanted}: {shown}{more}; {offering}"]


def describe_constraints(constraints: Mapping[str, Sequence[Constraints]]) -> list[str]:
    """One line per component with constraints, for a reservation that timed out."""
    lines = []
    for component, per_rank in constraints.items():
        distinct = sorted({process for process in per_rank if process}, key=Constraints.describe)
        if distinct:
            lines.append(f"component {component!r}: " + " | ".join(c.describe() for c in distinct))
    return lines
