"""``Placement``: where exactly one process of a component runs."""

from typing import Any, NamedTuple

# Ray resource name of an accelerator -> the environment variable that hides the others.
VISIBILITY_ENV = {
    "GPU": "CUDA_VISIBLE_DEVICES",
    "NPU": "ASCEND_RT_VISIBLE_DEVICES",
    "HPU": "HABANA_VISIBLE_MODULES",
    "XPU": "ONEAPI_DEVICE_SELECTOR",
    "TPU": "TPU_VISIBLE_CHIPS",
}


class Placement(NamedTuple):
    """One process of a component, fully resolved: RLinf's ``Placement`` fields with RLinf's types,
    plus ``world_size``, ``hardware_type`` and ``hardware_ranks``.

    Immutable (a named tuple, because planning 36,000 processes must take milliseconds and frozen
    dataclasses are several times slower to build); treat the lists as read-only. Every record is
    built in one place, ``rlinfra.placement.strategies.build_placements``, from a resource pool
    (``rlinfra.placement.resources``); each field comes from:

    * ``rank``, ``world_size`` — the process within its component, in strategy order;
    * ``cluster_node_rank`` — the node of the process's resources, in the cluster's node ranks
      (``rlinfra.runtime.discovery`` ranks live nodes); ``placement_node_rank`` — that node's index
      among the component's nodes, in order of first use;
    * ``local_rank`` / ``local_world_size`` — the process among the component's processes on its
      node: the true index, isolated or not (RLinf's workers see 0 when not isolated);
    * ``accelerator_type`` — the Ray resource name of the node's accelerators (``"GPU"``), None
      for a node without any;
    * ``hardware_type`` — the kind of the process's resources: an accelerator type, a custom
      hardware type (``"Franka"``), or ``"node"`` for whole nodes;
    * ``hardware_ranks`` — the resources' ranks in the numbering of the component's node groups
      (what the placement string wrote); ``local_hardware_ranks`` — their node-local indices
      (empty for whole nodes);
    * ``visible_accelerators`` / ``local_accelerator_rank`` — as in RLinf: the process's own
      accelerator indices when it is isolated on accelerators, else all of its node's; the first
      of them, or -1 when there are none;
    * ``isolate_accelerator`` — whether the process is restricted to its accelerators;
      ``visibility_env`` turns that into the variable the worker sets in its process before user
      code runs (``rlinfra.runtime.env.rlinfra_layer`` composes it, ``rlinfra.runtime.worker``
      sets it);
    * ``node_group_label`` — the node group of the process's resources.
    """

    rank: int
    world_size: int
    cluster_node_rank: int
    placement_node_rank: int
    local_rank: int
    local_world_size: int
    accelerator_type: str | None
    local_accelerator_rank: int
    visible_accelerators: list[str]
    isolate_accelerator: bool
    hardware_type: str
    hardware_ranks: list[int]
    local_hardware_ranks: list[int]
    node_group_label: str

    @property
    def is_isolated(self) -> bool:
        """Whether the process must be restricted to ``visible_accelerators`` (it is isolated, and
        its resources are accelerators)."""
        return self.isolate_accelerator and self.hardware_type == self.accelerator_type

    @property
    def visible_devices(self) -> str | None:
        """The value of the visibility variable (``"0,1"``), or None when nothing is hidden."""
        return ",".join(self.visible_accelerators) if self.is_isolated else None

    @property
    def visibility_env(self) -> dict[str, str]:
        """The environment that restricts this process to its accelerators (empty if none)."""
        if not self.is_isolated:
            return {}
        kind = self.hardware_type  # an accelerator type, since the process is isolated on it
        return {VISIBILITY_ENV.get(kind, f"{kind}_VISIBLE_DEVICES"): ",".join(self.visible_accelerators)}

    def to_dict(self) -> dict[str, Any]:
        data = self._asdict()
        data["visible_devices"] = self.visible_devices
        return data
