"""Hard topology constraints of node groups and components (``constraints:`` in the YAML).

    constraints:
      nodes: 0-1                  # components only: the node ranks the placement may use
      resources: {nvlink_domain_0: 1}   # Ray custom resources each process needs
      labels: {zone: a}           # Ray node labels every node used must carry

Placement already pins every process to one node, so ``nodes`` is checked here, against the
placement, at parse time. ``resources`` and ``labels`` depend on the live cluster: the runtime adds
them to the placement group (bundle resources, bundle label selectors) and checks them against
the nodes before reserving, because Ray would wait forever for a resource or label no node has.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlinfra.placement.config_access import as_mapping, as_section, parse_rank_list, require_str
from rlinfra.placement.errors import PlacementError, short_ranks
from rlinfra.placement.record import VISIBILITY_ENV, Placement

_FIELDS = ("nodes", "resources", "labels")
# Ray's own resources are requested by the placement itself; a constraint naming them would
# double-book or contradict it.
_BUILTIN_RESOURCES = frozenset({"CPU", "memory", "object_store_memory", *VISIBILITY_ENV})
_BUILTIN_PREFIXES = ("node:", "accelerator_type:")
NODE_ID_LABEL = "ray.io/node-id"  # rlinfra pins bundles with it; users pin with ``nodes``


@dataclass(frozen=True)
class Constraints:
    """Requirements a process's node must meet. ``resources`` and ``labels`` are sorted
    ``(name, value)`` pairs, so that constraints compare and hash as values."""

    nodes: tuple[int, ...] | None = None
    resources: tuple[tuple[str, float], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return self.nodes is not None or bool(self.resources) or bool(self.labels)

    def refined_by(self, other: Constraints, where: str) -> Constraints:
        """A node group's constraints narrowed by a component's: both sets of labels must hold
        (a key with two values is an error — no node could carry both); for a resource both
        name, the component's amount wins."""
        labels = dict(self.labels)
        for key, value in other.labels:
            if labels.get(key, value) != value:
                raise PlacementError(
                    f"label {key!r} must be {labels[key]!r} (node group) and {value!r} (component)",
                    where=where,
                    expected="one value per label key",
                )
            labels[key] = value
        resources = {**dict(self.resources), **dict(other.resources)}
        nodes = other.nodes if other.nodes is not None else self.nodes
        return Constraints(nodes, tuple(sorted(resources.items())), tuple(sorted(labels.items())))

    def describe(self) -> str:
        """``resources nvlink_domain_0=1; labels zone=a`` — for error messages and tables."""
        parts = []
        if self.nodes is not None:
            parts.append(f"nodes {short_ranks(sorted(self.nodes))}")
        if self.resources:
            parts.append("resources " + ", ".join(f"{name}={amount:g}" for name, amount in self.resources))
        if self.labels:
            parts.append("labels " + ", ".join(f"{key}={value}" for key, value in self.labels))
        return "; ".join(parts) or "none"


NO_CONSTRAINTS = Constraints()


def parse_constraints(raw: Any, where: str, num_nodes: int, allow_nodes: bool = True) -> Constraints:
    """The ``constraints`` mapping at ``where``; ``nodes`` only where ``allow_nodes`` (a node
    group's nodes are its ``node_ranks`` already)."""
    if raw is None:
        return NO_CONSTRAINTS
    section = as_section(raw, _FIELDS if allow_nodes else _FIELDS[1:], where)
    ranks = section.get("nodes")
    nodes = None if ranks is None else tuple(sorted(parse_rank_list(ranks, f"{where}.nodes", num_nodes)))
    resources = _parse_resources(section.get("resources"), f"{where}.resources")
    return Constraints(nodes, resources, _parse_labels(section.get("labels"), f"{where}.labels"))


def _named(raw: Any, where: str) -> Iterator[tuple[str, Any]]:
    """The ``name: value`` pairs of a mapping (none if absent), each name checked as it is reached."""
    for name, value in () if raw is None else as_mapping(raw, where).items():
        yield require_str(name, where), value


def _parse_resources(raw: Any, where: str) -> tuple[tuple[str, float], ...]:
    resources = {}
    for name, amount in _named(raw, where):
        if name in _BUILTIN_RESOURCES or name.startswith(_BUILTIN_PREFIXES):
            raise PlacementError(
                f"{name!r} is one of Ray's own resources",
                where=where,
                expected="custom resources only (CPUs and accelerators come from the placement)",
            )
        valid = isinstance(amount, (int, float)) and not isinstance(amount, bool) and math.isfinite(amount)
        if not valid or amount <= 0 or (amount > 1 and amount != int(amount)):
            raise PlacementError(
                f"resource {name!r} amount {amount!r}",
                where=where,
                expected="a positive number per process: a fraction up to 1, or a whole number",
            )
        resources[name] = float(amount)
    return tuple(sorted(resources.items()))


def _parse_labels(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    labels = {}
    for key, value in _named(raw, where):
        if key == NODE_ID_LABEL:
            raise PlacementError(
                f"label {key!r} is set by rlinfra", where=where, expected="constraints.nodes to pin nodes"
            )
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise PlacementError(f"label {key!r} value {value!r}", where=where, expected="a string")
        text = str(value).strip()
        if not text or text.startswith("!") or "(" in text:
            raise PlacementError(
                f"label {key!r} value {text!r}", where=where, expected="an exact value (no operators)"
            )
        labels[key] = text
    return tuple(sorted(labels.items()))


def check_nodes(constraints: Constraints, placements: Sequence[Placement], where: str) -> None:
    """``constraints.nodes`` against the placement: every process on an allowed node."""
    if constraints.nodes is None:
        return
    allowed = set(constraints.nodes)
    stray = [placement for placement in placements if placement.cluster_node_rank not in allowed]
    if stray:
        nodes = sorted({placement.cluster_node_rank for placement in stray})
        raise PlacementError(
            f"rank {stray[0].rank} is placed on node {stray[0].cluster_node_rank}, outside "
            f"constraints.nodes {short_ranks(list(constraints.nodes))} ({len(stray)} rank(s) on "
            f"node(s) {short_ranks(nodes)})",
            where=where,
            expected="a placement on the allowed nodes only, or a wider constraints.nodes",
        )


def process_constraints(
    placements: Sequence[Placement],
    component: Constraints,
    group_constraints: Mapping[str, Constraints],
    where: str | None = None,
) -> list[Constraints]:
    """The constraints of each process: its node group's (``group_constraints``: label →
    constraints), refined by its component's; a conflict names ``where``, by default the group."""
    by_label = {
        label: group_constraints.get(label, NO_CONSTRAINTS).refined_by(
            component, where or f"node group {label!r}"
        )
        for label in dict.fromkeys(placement.node_group_label for placement in placements)
    }
    return [by_label[placement.node_group_label] for placement in placements]
