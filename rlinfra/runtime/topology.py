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
        asked: dict[Any, set[int]] = {}  # a resource's name or a (key, value) label → the nodes asked
        amounts: dict[str, float] = {}  # per process
        for row, process in zip(plan.reservations[component], per_rank, strict=True):
            amounts.update(process.resources)
            for wanted in (*dict(process.resources), *process.labels):
                asked.setdefault(wanted, set()).add(plan.bundle_nodes[row.bundle_index])
        for wanted, on in asked.items():
            if isinstance(wanted, str):
                problem = _resource_problem(wanted, amounts[wanted], sorted(on), per_node, nodes)
            else:
                problem = _label_problem(wanted, sorted(on), nodes)
            if problem:
                problems.append(f"component {component!r} requires {problem}")
    if problems:
        raise TopologyError(
            "the topology constraints cannot be met on this cluster (Ray would wait forever):\n"
            + "\n".join(f"  {problem}" for problem in problems)
        )


def _resource_problem(
    name: str, amount: float, asked_on: list[int], per_node: dict[int, dict[str, float]], nodes: Sequence[Any]
) -> str | None:
    lacking = []
    for rank in asked_on:
        have, need = nodes[rank].resources.get(name, 0.0), per_node.get(rank, {}).get(name, 0.0)
        if have + _EPSILON < need:
            lacking.append(f"node {rank} has {have:g}, needs {need:g}")
    having = [node.rank for node in nodes if node.resources.get(name, 0.0) > 0]
    return _problem(f"resource {name}={amount:g} per process", lacking, name, having)


def _label_problem(label: tuple[str, str], asked_on: list[int], nodes: Sequence[Any]) -> str | None:
    key, value = label
    lacking = []
    for rank in asked_on:
        actual = nodes[rank].labels.get(key)
        if actual != value:
            has = f"{key}={actual}" if actual is not None else f"no {key!r} label"
            lacking.append(f"node {rank} has {has}")
    having = [node.rank for node in nodes if node.labels.get(key) == value]
    return _problem(f"node label {key}={value}", lacking, f"{key}={value}", having)


def _problem(wanted: str, lacking: list[str], offered: str, having: list[int]) -> str | None:
    """What is wanted and which nodes lack it (at most a few named), if any does."""
    if not lacking:
        return None
    more = f", … ({len(lacking)} nodes)" if len(lacking) > _SHOWN_NODES else ""
    return f"{wanted}: {', '.join(lacking[:_SHOWN_NODES])}{more}; nodes with {offered}: {short_ranks(having)}"


def describe_constraints(constraints: Mapping[str, Sequence[Constraints]]) -> str:
    """For a reservation that timed out: a line per component with constraints, under a heading
    (empty when there are none)."""
    lines = []
    for component, per_rank in constraints.items():
        distinct = sorted({process for process in per_rank if process}, key=Constraints.describe)
        if distinct:
            lines.append(f"\n    component {component!r}: " + " | ".join(c.describe() for c in distinct))
    return "\n  topology constraints in force:" + "".join(lines) if lines else ""
