"""Who sits where: the node × device occupancy of a plan, as plain data for the map view.

For each node shown, the map says which processes of which component use each accelerator,
the node as a whole (components on the reserved ``node`` group or on accelerator-less groups),
and each custom hardware unit. It is built in one pass over the placements, skipping nodes
beyond the display limit, so a 1,000-node plan costs milliseconds and memory for 32 rows.
"""

from dataclasses import dataclass, field

from rlinfra.placement import CLUSTER_GROUP, NODE_GROUP, ClusterSpec, ComponentPlacement, HardwareUnit
from rlinfra.placement.node_groups import NODE_KIND

# component name -> its process ranks on one slot, ascending
Occupants = dict[str, list[int]]


@dataclass
class NodeRow:
    """Occupancy of one node. ``accelerators[i]`` holds the processes on local accelerator ``i``."""

    rank: int
    groups: list[str]
    accelerators: list[Occupants]
    whole_node: Occupants = field(default_factory=dict)
    hardware: dict[HardwareUnit, Occupants] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceMap:
    """The rows to draw, plus what the columns need to know about the whole map."""

    rows: list[NodeRow]
    max_accelerators: int
    accelerator_type: str
    has_whole_node: bool
    has_hardware: bool


def build_device_map(
    spec: ClusterSpec, placement: ComponentPlacement, node_limit: int | None = None
) -> DeviceMap:
    """Occupancy of nodes ``0..node_limit-1`` (all nodes when ``node_limit`` is None)."""
    nodes = spec.nodes[:node_limit]
    rows = [NodeRow(node.rank, [], [{} for _ in range(node.num_accelerators)]) for node in nodes]
    for group in spec.node_groups.values():
        if group.label in (CLUSTER_GROUP, NODE_GROUP):
            continue
        for rank in group.node_ranks:
            if rank < len(rows):
                rows[rank].groups.append(group.label)
        for unit in group.hardware:  # every unit is listed, idle ones too: they are worth seeing
            if unit.node_rank < len(rows):
                rows[unit.node_rank].hardware[unit] = {}
    has_whole_node = False
    for name in placement.components:
        for record in placement.get_placements(name):
            has_whole_node = has_whole_node or record.hardware_type == NODE_KIND
            if record.cluster_node_rank >= len(rows):
                continue
            row = rows[record.cluster_node_rank]
            if record.hardware_type == NODE_KIND:
                row.whole_node.setdefault(name, []).append(record.rank)
            elif record.hardware_type == record.accelerator_type:
                for device in record.local_hardware_ranks:
                    row.accelerators[device].setdefault(name, []).append(record.rank)
            else:
                for unit in spec.hardware_units(record):
                    row.hardware.setdefault(unit, {}).setdefault(name, []).append(record.rank)
    accelerated = [node for node in nodes if node.num_accelerators]
    return DeviceMap(
        rows=rows,
        max_accelerators=max((node.num_accelerators for node in accelerated), default=0),
        accelerator_type=accelerated[0].accelerator_type if accelerated else "GPU",
        has_whole_node=has_whole_node,
        has_hardware=any(row.hardware for row in rows),
    )
