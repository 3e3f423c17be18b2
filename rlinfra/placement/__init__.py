"""The pure placement layer: config → cluster description → per-process ``Placement`` records.

No Ray, torch or numpy here and no I/O, so everything can be planned and tested without a cluster.
"""

from typing import TYPE_CHECKING

from rlinfra.lazy_exports import lazy_exports

if TYPE_CHECKING:  # for type checkers; at run time each name is imported on first use
    from rlinfra.placement.cluster_spec import ClusterSpec as ClusterSpec
    from rlinfra.placement.component import ComponentPlacement as ComponentPlacement
    from rlinfra.placement.config import ClusterConfig as ClusterConfig
    from rlinfra.placement.config import ComponentConfig as ComponentConfig
    from rlinfra.placement.config import parse_cluster_config as parse_cluster_config
    from rlinfra.placement.errors import PlacementError as PlacementError
    from rlinfra.placement.node_groups import CLUSTER_GROUP as CLUSTER_GROUP
    from rlinfra.placement.node_groups import NODE_GROUP as NODE_GROUP
    from rlinfra.placement.node_groups import EnvConfig as EnvConfig
    from rlinfra.placement.node_groups import HardwareUnit as HardwareUnit
    from rlinfra.placement.node_groups import NodeGroup as NodeGroup
    from rlinfra.placement.node_groups import NodeSpec as NodeSpec
    from rlinfra.placement.record import VISIBILITY_ENV as VISIBILITY_ENV
    from rlinfra.placement.record import Placement as Placement
    from rlinfra.placement.strategies import FlexiblePlacementStrategy as FlexiblePlacementStrategy
    from rlinfra.placement.strategies import NodePlacementStrategy as NodePlacementStrategy
    from rlinfra.placement.strategies import PackedPlacementStrategy as PackedPlacementStrategy
    from rlinfra.placement.strategies import PlacementStrategy as PlacementStrategy

# Loaded on first use: a worker process imports ``record`` and ``node_groups`` but never the
# config parser behind ``ComponentPlacement``.
_NAMES_BY_MODULE = {
    "cluster_spec": ("ClusterSpec",),
    "component": ("ComponentPlacement",),
    "config": ("ClusterConfig", "ComponentConfig", "parse_cluster_config"),
    "errors": ("PlacementError",),
    "node_groups": ("CLUSTER_GROUP", "NODE_GROUP", "EnvConfig", "HardwareUnit", "NodeGroup", "NodeSpec"),
    "record": ("VISIBILITY_ENV", "Placement"),
    "strategies": (
        "FlexiblePlacementStrategy", "NodePlacementStrategy", "PackedPlacementStrategy", "PlacementStrategy"
    ),
}  # fmt: skip
_EXPORTS = {name: f"{__name__}.{module}" for module, names in _NAMES_BY_MODULE.items() for name in names}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
