"""``Placement``: where exactly one process of a component runs."""

from __future__ import annotations

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
    """One process of a component, fully resolved (an immutable record; a named tuple because
    planning 32,000 processes must take milliseconds, and frozen dataclasses are 4x slower to build).

    ``rank``/``world_size``: the process within its component. ``cluster_node_rank``: the node in
    the cluster; ``placement_node_rank``: that node's index among the component's nodes (in order of
    first use). ``local_rank``/``local_world_size``: the process among the component's processes on
    its node — the true index, isolated or not. ``resource_ranks``: indices into the node groups'
    resource numbering; ``local_hardware_ranks``: node-local device or unit indices (empty for node
    resources). ``visible_devices``: the value for the visibility variable (``"0,1"``), or None when
    the process is not isolated or the resource is not an accelerator.
    """

    rank: int
    world_size: int
    cluster_node_rank: int
    placement_node_rank: int
    local_rank: int
    local_world_size: int
    hardware_type: str
    resource_ranks: tuple[int, ...]
    local_hardware_ranks: tuple[int, ...]
    visible_devices: str | None
    node_group_label: str

    @property
    def visibility_env(self) -> dict[str, str]:
        """The environment that restricts this process to its accelerators (empty if none)."""
        if self.visible_devices is None:
            return {}
        name = VISIBILITY_ENV.get(self.hardware_type, f"{self.hardware_type}_VISIBLE_DEVICES")
        return {name: self.visible_devices}

    def to_dict(self) -> dict[str, Any]:
        data = self._asdict()
        data["resource_ranks"] = list(self.resource_ranks)
        data["local_hardware_ranks"] = list(self.local_hardware_ranks)
        return data
