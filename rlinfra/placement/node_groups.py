"""The cluster's nodes and node groups as records, and the parser of ``cluster.node_groups``.

A leaf of the placement layer: the records here (``NodeSpec``, ``HardwareUnit``, ``EnvConfig``,
``NodeGroup``) are what every other module reads — resource pools, the cluster spec, worker
environments, executables — and this module reads none of them back.

    node_groups:
      - label: franka                  # unique; not 'cluster' or 'node' (reserved)
        node_ranks: 0-1                # an int, '0-3,6', a YAML list, or 'all'
        hardware:                      # custom hardware: each entry is one unit on its node
          type: Franka
          configs: [{node_rank: 0, robot_ip: 10.0.0.8}, {node_rank: 1, robot_ip: 10.0.0.9}]
        env_configs:                   # environment of the processes on some of its nodes
          - node_ranks: 0
            env_vars: [{ROS_DOMAIN_ID: "3"}]
            python_interpreter_path: /opt/venv/franka/bin/python
        constraints: {labels: {zone: a}}
"""

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from rlinfra.config import Section, parse
from rlinfra.placement.config_access import (
    absolute_path,
    as_mapping,
    as_section,
    parse_rank_list,
    require_int,
    require_list,
    require_str,
)
from rlinfra.placement.constraints import NO_CONSTRAINTS, Constraints, parse_constraints
from rlinfra.placement.env_vars import NO_ENV_VARS, EnvVars, parse_env_vars
from rlinfra.placement.errors import PlacementError, short_ranks
from rlinfra.placement.grammar import ALL

CLUSTER_GROUP = "cluster"  # every node, its accelerators as resources (the shorthand's group)
NODE_GROUP = "node"  # every node, the nodes themselves as resources
RESERVED_GROUPS = (CLUSTER_GROUP, NODE_GROUP)
NODE_KIND = "node"  # the resource kind of a whole node
DEFAULT_ACCELERATOR_TYPE = "GPU"

# nvidia-smi's total memory of known accelerators, in GiB (MiB / 1024): the memory plan's devices.
ACCELERATOR_GIB = {
    "A10": 22.49,
    "A100-40GB": 40.0,
    "A100-80GB": 80.0,
    "H100": 79.65,
    "H20": 95.58,
    "H200": 140.4,
    "L4": 22.49,
    "L40S": 44.99,
}
_HARDWARE_FIELDS = ("type", "configs")
_ENV_FIELDS = ("node_ranks", "env_vars", "python_interpreter_path")


@dataclass(frozen=True)
class NodeSpec:
    """One node: its cluster node rank and its accelerators (``accelerator_type`` is a Ray resource
    name such as ``GPU`` or ``NPU``)."""

    rank: int
    num_accelerators: int = 0
    accelerator_type: str = DEFAULT_ACCELERATOR_TYPE


@dataclass(frozen=True)
class HardwareUnit:
    """One unit of custom hardware (a robot, a camera rig …) attached to a node.

    ``index`` is the unit's position among this type's units on that node, which is what a worker
    sees as its local hardware rank; ``fields`` keeps the rest of the user's config entry (a
    robot's IP, camera serials), which the worker driving the unit reads as its hardware info.
    """

    type: str
    node_rank: int
    index: int
    fields: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class EnvConfig:
    """Environment for the processes on some nodes of a group (``env_configs`` in the YAML):
    variables, and the Python interpreter the workers there run under (an absolute path)."""

    node_ranks: tuple[int, ...]
    env_vars: EnvVars = field(default=NO_ENV_VARS, compare=False)
    python_interpreter_path: str | None = None


@dataclass(frozen=True)
class NodeGroup:
    """A labelled set of nodes whose resources a component may be placed on; ``constraints`` are
    the custom resources and node labels every process placed on the group needs."""

    label: str
    node_ranks: tuple[int, ...]
    hardware_type: str | None = None
    hardware: tuple[HardwareUnit, ...] = ()
    env_configs: tuple[EnvConfig, ...] = ()
    ignore_hardware: bool = False
    constraints: Constraints = NO_CONSTRAINTS
    accelerator_gib: float | None = None  # each accelerator's memory, for the memory plan

    def interpreter_on(self, node_rank: int) -> str | None:
        """The ``python_interpreter_path`` of this group's processes on ``node_rank``, if set."""
        for config in self.env_configs:
            if config.python_interpreter_path and node_rank in config.node_ranks:
                return config.python_interpreter_path
        return None


def parse_node_groups(raw: Any, num_nodes: int, where: str = "cluster.node_groups") -> tuple[NodeGroup, ...]:
    """``cluster.node_groups`` as records, every field checked; labels unique and not reserved,
    and no node's unit of one hardware type in two groups (two processes could drive it)."""
    if raw is None:
        return ()
    require_list(raw, where, "a YAML list of {label, node_ranks, ...}")
    groups: dict[str, NodeGroup] = {}
    owner_of_units: dict[tuple[int, str], str] = {}
    for index, entry in enumerate(raw):
        group = _parse_group(entry, f"{where}[{index}]", num_nodes)
        if group.label in groups or group.label in RESERVED_GROUPS:
            what = "reserved" if group.label in RESERVED_GROUPS else "already defined"
            raise PlacementError(
                f"node group label {group.label!r} is {what}",
                where=f"{where}[{index}].label",
                expected="a unique label other than 'cluster' and 'node'",
            )
        for unit in group.hardware:
            other = owner_of_units.setdefault((unit.node_rank, unit.type), group.label)
            if other != group.label:
                raise PlacementError(
                    f"node {unit.node_rank}'s {unit.type} hardware is declared by node groups "
                    f"{other!r} and {group.label!r}",
                    where=f"{where}[{index}].hardware",
                    expected="each node's units of one type in one node group",
                )
        groups[group.label] = group
    return tuple(groups.values())


def _label_text(value: Any, where: str) -> str:
    """A node group label. YAML reads ``label: 4090`` (the seed's own example) as an int, so
    integers are labels too, spelt as written."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    label = require_str(value, where)
    if "," in label:
        raise PlacementError(
            f"node group label {label!r} contains a comma",
            where=where,
            expected="a label without commas (commas separate labels in node_group)",
        )
    return label


class _Group(Section):
    """One ``node_groups`` entry as written; what other functions parse is passed on."""

    label: Any = None
    node_ranks: Any = Field(description="such as '0-1' or 'all'")
    hardware: Any = None
    env_configs: Any = None
    ignore_hardware: bool = Field(default=False, strict=True)
    constraints: Any = None
    accelerator: Any = None


def _parse_group(raw: Any, where: str, num_nodes: int) -> NodeGroup:
    group = parse(_Group, as_mapping(raw, where), where, PlacementError)
    label = _label_text(group.label, f"{where}.label")
    node_ranks = tuple(sorted(parse_rank_list(group.node_ranks, f"{where}.node_ranks", num_nodes)))
    if group.ignore_hardware and group.hardware is not None:
        raise PlacementError(
            "a node group with ignore_hardware: true cannot declare hardware",
            where=f"{where}.hardware",
            expected="either hardware or ignore_hardware: true",
        )
    return NodeGroup(
        label,
        node_ranks,
        *_parse_hardware(group.hardware, f"{where}.hardware", node_ranks),
        _parse_env_configs(group.env_configs, f"{where}.env_configs", node_ranks, num_nodes),
        group.ignore_hardware,
        parse_constraints(group.constraints, f"{where}.constraints", num_nodes, allow_nodes=False),
        accelerator_gib(group.accelerator, f"{where}.accelerator"),
    )


def accelerator_gib(raw: Any, where: str) -> float | None:
    """An ``accelerator``: a known name (``H100``) or ``{memory_gib: N}``, as its memory in GiB."""
    if raw is None:
        return None
    if isinstance(raw, str) and raw in ACCELERATOR_GIB:
        return ACCELERATOR_GIB[raw]
    memory = as_section(raw, ("memory_gib",), where).get("memory_gib") if isinstance(raw, Mapping) else None
    if isinstance(memory, (int, float)) and not isinstance(memory, bool) and memory > 0:
        return float(memory)
    raise PlacementError(
        f"unknown accelerator {raw!r}" if isinstance(raw, str) else f"expected a memory size, got {raw!r}",
        where=where,
        expected="one of " + ", ".join(ACCELERATOR_GIB) + ", or {memory_gib: N} (N > 0)",
    )


def _parse_hardware(
    raw: Any, where: str, node_ranks: tuple[int, ...]
) -> tuple[str | None, tuple[HardwareUnit, ...]]:
    if raw is None:
        return None, ()
    section = as_section(raw, _HARDWARE_FIELDS, where)
    hardware_type = require_str(section.get("type"), f"{where}.type")
    if hardware_type.lower() == NODE_KIND:
        raise PlacementError(
            "hardware type 'node' is reserved", where=f"{where}.type", expected="another type name"
        )
    configs = section.get("configs") or []
    if not isinstance(configs, list) or not configs:
        raise PlacementError(
            "a hardware type needs at least one unit",
            where=f"{where}.configs",
            expected="a list of {node_rank: N, ...} entries, one per unit",
        )
    members = set(node_ranks)
    units: list[HardwareUnit] = []
    on_node: Counter[int] = Counter()  # units so far on each node: the next unit's local index
    first_index: dict[tuple[int, str], int] = {}
    for index, entry in enumerate(configs):
        entry_where = f"{where}.configs[{index}]"
        unit = as_mapping(entry, entry_where)
        node_rank = require_int(unit.get("node_rank"), f"{entry_where}.node_rank")
        _check_members((node_rank,), members, f"{entry_where}.node_rank")
        fields = {key: value for key, value in unit.items() if key != "node_rank"}
        identity = (node_rank, repr(sorted(fields.items(), key=lambda item: str(item[0]))))
        earlier = first_index.setdefault(identity, index)
        if earlier != index:
            raise PlacementError(
                f"configs[{index}] repeats configs[{earlier}] on node {node_rank}: one {hardware_type} "
                "listed twice would be driven by two processes",
                where=entry_where,
                expected="each unit once (units of one node differ in at least one field, e.g. an IP)",
            )
        units.append(HardwareUnit(hardware_type, node_rank, on_node[node_rank], fields))
        on_node[node_rank] += 1
    return hardware_type, tuple(sorted(units, key=lambda unit: unit.node_rank))


def _parse_env_configs(
    raw: Any, where: str, node_ranks: tuple[int, ...], num_nodes: int
) -> tuple[EnvConfig, ...]:
    if raw is None:
        return ()
    require_list(raw, where, "a list of {node_ranks, env_vars, ...}")
    members = set(node_ranks)
    configs = []
    interpreter_of: dict[int, tuple[str, int]] = {}
    for index, entry in enumerate(raw):
        entry_where = f"{where}[{index}]"
        section = as_section(entry, _ENV_FIELDS, entry_where)
        given = section.get("node_ranks", ALL)  # by default, every node of the group
        ranks = tuple(parse_rank_list(given, f"{entry_where}.node_ranks", num_nodes, all_ranks=node_ranks))
        _check_members(ranks, members, f"{entry_where}.node_ranks")
        env_vars = parse_env_vars(section.get("env_vars"), f"{entry_where}.env_vars")
        interpreter = absolute_path(
            section.get("python_interpreter_path"),
            f"{entry_where}.python_interpreter_path",
            expected="an absolute path such as /opt/venv/bin/python, valid on every node it covers",
        )
        if interpreter is not None:  # entries may overlap and layer variables; a process has one interpreter
            for rank in ranks:
                earlier = interpreter_of.setdefault(rank, (interpreter, index))
                if earlier[0] != interpreter:
                    raise PlacementError(
                        f"node {rank} gets python_interpreter_path {earlier[0]!r} from entry {earlier[1]} "
                        f"and {interpreter!r} from entry {index}",
                        where=f"{entry_where}.python_interpreter_path",
                        expected="one interpreter per node in a node group",
                    )
        configs.append(EnvConfig(ranks, env_vars, interpreter))
    return tuple(configs)


def _check_members(ranks: tuple[int, ...], members: set[int], where: str) -> None:
    stray = [rank for rank in ranks if rank not in members]
    if stray:
        raise PlacementError(
            f"node rank {stray[0]} is not in this node group",
            where=where,
            expected=f"node ranks among {short_ranks(sorted(members))}",
        )
