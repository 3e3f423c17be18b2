"""The layout table: one placement group for a job, and each component's slice of it.

Pure data (no Ray import), so ``rlinfra plan`` can print it without a cluster. Computed from the
component placements alone — no second source of truth:

* devices used together by any process (on one node) form one bundle; bundles are ordered by
  (node rank, device id as a number), which is what keeps rank → device stable across restarts,
  since Ray hands out device instances in bundle order on a node;
* processes that share a device reserve ``1/users`` of it, where ``users`` counts the processes
  of *all* components on that device (trainer + rollout colocated on a GPU: 0.5 each) — the
  fractions follow the placement instead of being hard-coded (see ``reservable`` for Ray's
  rounding rules);
* processes placed on whole nodes share one CPU bundle per node;
* CPUs: a component's ``num_cpus`` per process, or by default one CPU per device and one per
  node, shared the same way (``plan_layout``);
* a component's slice is the bundle ranges it uses: colocated components share bundles,
  disaggregated ones use disjoint bundles, and one job may mix both;
* topology constraints (``rlinfra.placement.constraints``) add each process's custom resources
  to its bundle and its reservation, and their node labels to the bundle's label selector.
"""

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rlinfra.placement.constraints import Constraints
from rlinfra.placement.record import VISIBILITY_ENV, Placement

MIN_BUNDLE_CPU = 0.001  # Ray rejects empty bundles; a token CPU reservation keeps one valid.
_RESOLUTION = 10_000  # Ray's fixed-point step for resource amounts
_EPSILON = 1e-9  # 1/3 * 3 must count as 1, not 0.9999999
NODE_KIND = "node"


@dataclass(frozen=True)
class ActorReservation:
    """What one worker actor asks Ray for, inside bundle ``bundle_index``."""

    bundle_index: int
    num_cpus: float
    num_gpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LayoutPlan:
    """Bundles of the job's placement group and every component's reservations in them.
    ``bundle_labels`` are the node labels each bundle's node must carry (from constraints)."""

    bundles: list[dict[str, float]]
    bundle_nodes: list[int]
    bundle_devices: list[tuple[int, ...]]
    reservations: dict[str, list[ActorReservation]]
    bundle_labels: list[dict[str, str]]

    def per_node(self) -> dict[int, dict[str, float]]:
        """Total resources requested on each node (for 'what is missing where' messages)."""
        totals: dict[int, Counter[str]] = defaultdict(Counter)
        for bundle, node in zip(self.bundles, self.bundle_nodes, strict=True):
            totals[node].update(bundle)
        return {node: dict(total) for node, total in totals.items()}

    def bundle_indices(self, component: str) -> list[int]:
        return sorted({r.bundle_index for r in self.reservations[component]})

    def slices(self, component: str) -> list[tuple[int, int]]:
        """The component's bundles as ``(offset, length)`` runs — one run for the usual layouts."""
        # Consecutive indices have the same index - position: each such group is one run.
        grouped = itertools.groupby(enumerate(self.bundle_indices(component)), lambda pair: pair[1] - pair[0])
        return [(run[0][1], len(run)) for run in (list(group) for _, group in grouped)]

    def relation(self, first: str, second: str) -> str:
        """``colocated`` (same bundles), ``disaggregated`` (disjoint) or ``partly colocated``."""
        a, b = set(self.bundle_indices(first)), set(self.bundle_indices(second))
        if a == b:
            return "colocated"
        if a.isdisjoint(b):
            return "disaggregated"
        return "partly colocated"


Device = tuple[int, str, int]  # (node rank, hardware type, node-local index)
BundleKey = tuple[int, int, str, tuple[int, ...]]  # (node rank, 0 devices | 1 node CPUs, kind, devices)


def plan_layout(
    placements: Mapping[str, Sequence[Placement]],
    num_cpus: float | Mapping[str, float | None] | None = None,
    node_resources: Mapping[int, Mapping[str, float]] | None = None,
    constraints: Mapping[str, Sequence[Constraints]] | None = None,
) -> LayoutPlan:
    """The layout of ``placements`` (component → its placements) in one placement group.

    ``num_cpus`` is CPUs per worker, for all components or per component; None (for all, or for
    one component) applies the default rule: one CPU per device, shared like the device (a worker
    alone on a GPU reserves 1 CPU, two colocated on it 0.5 each), and one CPU per node shared by
    the processes placed on that whole node (the seed's 512 agent processes reserve 1 CPU per
    node, not 512). ``node_resources`` (node rank → Ray resources) lets custom hardware such as
    robots be reserved where a node advertises a Ray resource of that name; otherwise only their
    CPUs are. ``constraints`` (component → one per rank) add custom resources and node labels.
    """
    node_resources = node_resources or {}
    constraints = constraints or {}

    users: Counter[Device] = Counter()
    node_users: Counter[int] = Counter()
    bundled: dict[Device, frozenset[Device]] = {}  # each device → the devices of its bundle
    for component_placements in placements.values():
        for placement in component_placements:
            devices = devices_of(placement)
            if not devices:
                node_users[placement.cluster_node_rank] += 1
            users.update(devices)
            # A process's devices share a bundle: with each other, and with those already bundled with them.
            merged = frozenset(devices).union(*(bundled.get(device, ()) for device in devices))
            bundled.update(dict.fromkeys(merged, merged))

    # Bundle keys: (node, 0, kind, devices) for device bundles, (node, 1, "node", ()) for the
    # node's CPU bundle; sorting them is the (node rank, device id) order.
    key_of = {device: _bundle_key(bundle) for device, bundle in bundled.items()}
    ordered = sorted(set(key_of.values()) | {(node, 1, NODE_KIND, ()) for node in node_users})
    index_of = {key: index for index, key in enumerate(ordered)}

    bundles: list[dict[str, float]] = [{"CPU": 0.0} for _ in ordered]
    labels: list[dict[str, str]] = [{} for _ in ordered]
    reservations: dict[str, list[ActorReservation]] = {}
    for name, component_placements in placements.items():
        rows = []
        per_rank = constraints.get(name)
        given = num_cpus.get(name) if isinstance(num_cpus, Mapping) else num_cpus
        for rank, placement in enumerate(component_placements):
            node, kind = placement.cluster_node_rank, placement.hardware_type
            devices = devices_of(placement)
            if not devices:
                index = index_of[(node, 1, NODE_KIND, ())]
                users_share = 1 / node_users[node]
            else:
                index = index_of[key_of[devices[0]]]
                users_share = sum(1 / users[device] for device in devices)
            cpu = reservable(users_share) if given is None else given
            bundles[index]["CPU"] = round(bundles[index]["CPU"] + cpu, 4)
            reserved = kind in VISIBILITY_ENV or kind in node_resources.get(node, {})
            if devices and reserved:
                bundles[index][kind] = float(len(ordered[index][3]))
            share = reservable(users_share) if devices and reserved else 0.0
            if kind == "GPU":
                row = ActorReservation(index, cpu, share)
            else:
                row = ActorReservation(index, cpu, 0.0, {kind: share} if share else {})
            if per_rank is not None and per_rank[rank]:
                row = _constrained(row, per_rank[rank], bundles[index], labels[index], name, rank)
            rows.append(row)
        reservations[name] = rows
    for bundle in bundles:
        bundle["CPU"] = max(bundle["CPU"], MIN_BUNDLE_CPU)
    nodes, bundle_devices = [key[0] for key in ordered], [key[3] for key in ordered]
    return LayoutPlan(bundles, nodes, bundle_devices, reservations, labels)


def _bundle_key(bundle: frozenset[Device]) -> BundleKey:
    node, kind, _ = min(bundle)  # one process's devices, and so a bundle's, are of one node and kind
    return (node, 0, kind, tuple(sorted(index for _, _, index in bundle)))


def reservable(share: float) -> float:
    """The amount of a shared resource one process may ask Ray for, given its exact share.

    Ray counts resources in steps of 1/10,000 and accepts a fraction only below 1, so a share is
    rounded *down* (seven processes on one GPU ask 0.1428 each: rounding to nearest, 0.1429, would
    add up to 1.0003 and the seventh could never be scheduled), and a share above 1 keeps its whole
    part: a process owning GPU 1 and a fifth of GPU 0 (``reward_server: 0-1:0`` beside four
    components on GPU 0) asks 1, not 1.2. Its bundle still holds every device whole, so no other
    Ray user can take them; only the split inside the bundle is approximate.
    """
    if share > 1:
        return float(math.floor(share + _EPSILON))
    return math.floor(share * _RESOLUTION + _EPSILON) / _RESOLUTION


def _constrained(
    row: ActorReservation,
    constraints: Constraints,
    bundle: dict[str, float],
    bundle_labels: dict[str, str],
    component: str,
    rank: int,
) -> ActorReservation:
    """``row`` with the process's custom resources, which its bundle must hold too; the bundle's
    node must carry every label any process in it requires."""
    for key, value in constraints.labels:
        if bundle_labels.setdefault(key, value) != value:
            raise ValueError(
                f"component {component!r}: rank {rank} needs node label {key}={value}, but a process "
                f"sharing its devices needs {key}={bundle_labels[key]}; no node carries both"
            )
    resources = dict(row.resources)
    for name, amount in constraints.resources:
        resources[name] = round(resources.get(name, 0.0) + amount, 4)
        bundle[name] = round(bundle.get(name, 0.0) + amount, 4)
    return ActorReservation(row.bundle_index, row.num_cpus, row.num_gpus, resources)


def devices_of(placement: Placement) -> list[Device]:
    """The devices a process holds, in its order (none for a process placed on a whole node)."""
    node, kind = placement.cluster_node_rank, placement.hardware_type
    return [(node, kind, index) for index in placement.local_hardware_ranks]
