"""Telling Ray the truth: placement-group bundles and per-actor reservations for a set of placements.

One bundle per distinct (node, device set) — so processes sharing a device share its bundle by
fractional reservations computed from the placement (2 processes on one GPU take 0.5 each) — and
one bundle per node for processes placed on whole nodes. Bundles are ordered by (node rank, device
ids as numbers): Ray hands out device instances in bundle order on a node, so this order is what
keeps rank → device stable across restarts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rlinfra.placement.record import VISIBILITY_ENV, Placement

MIN_BUNDLE_CPU = 0.001  # Ray rejects empty bundles; a token CPU reservation keeps one valid.


@dataclass(frozen=True)
class ActorReservation:
    """What one worker actor asks Ray for, inside bundle ``bundle_index``."""

    bundle_index: int
    num_cpus: float
    num_gpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class BundlePlan:
    bundles: list[dict[str, float]]
    bundle_nodes: list[int]
    actors: list[ActorReservation]

    def per_node(self) -> dict[int, dict[str, float]]:
        """Total resources requested on each node (for 'what is missing where' messages)."""
        totals: dict[int, dict[str, float]] = {}
        for bundle, node in zip(self.bundles, self.bundle_nodes, strict=True):
            node_total = totals.setdefault(node, {})
            for name, amount in bundle.items():
                node_total[name] = node_total.get(name, 0.0) + amount
        return totals


def plan_bundles(
    placements: Sequence[Placement],
    num_cpus: float = 1.0,
    node_resources: Mapping[int, Mapping[str, float]] | None = None,
) -> BundlePlan:
    """Bundles and reservations for ``placements``.

    ``node_resources`` (node rank → Ray resources) lets custom hardware such as robots be
    reserved when the node advertises a Ray resource of that name; otherwise only CPUs are.
    """
    node_resources = node_resources or {}
    keyed: dict[tuple[int, tuple[int, ...]], list[Placement]] = {}
    for placement in placements:
        devices = () if placement.hardware_type == "node" else placement.local_hardware_ranks
        keyed.setdefault((placement.cluster_node_rank, devices), []).append(placement)

    bundles: list[dict[str, float]] = []
    bundle_nodes: list[int] = []
    actors: dict[int, ActorReservation] = {}
    for index, ((node, devices), sharing) in enumerate(sorted(keyed.items())):
        kind = sharing[0].hardware_type
        bundle: dict[str, float] = {"CPU": max(num_cpus * len(sharing), MIN_BUNDLE_CPU)}
        per_actor_device = 0.0
        reserves_device = devices and (kind in VISIBILITY_ENV or kind in node_resources.get(node, {}))
        if reserves_device:
            bundle[kind] = float(len(devices))
            per_actor_device = len(devices) / len(sharing)
        bundles.append(bundle)
        bundle_nodes.append(node)
        for placement in sharing:
            gpus = per_actor_device if kind == "GPU" else 0.0
            other = {kind: per_actor_device} if reserves_device and kind != "GPU" else {}
            actors[placement.rank] = ActorReservation(index, num_cpus, gpus, other)
    return BundlePlan(bundles, bundle_nodes, [actors[p.rank] for p in placements])
