"""The pure placement layer: config → cluster description → per-process ``Placement`` records.

No Ray, torch or numpy here and no I/O, so everything can be planned and tested without a cluster.
"""

from typing import TYPE_CHECKING

from rlinfra.lazy_exports import lazy_exports

if TYPE_CHECKING:  # for type checkers; at run time each name is imported on first use
    from rlinfra.placement.cluster_spec import ClusterSpec
    from rlinfra.placement.component import ComponentPlacement
    from rlinfra.placement.config import ClusterConfig, ComponentConfig, parse_cluster_config
    from rlinfra.placement.errors import PlacementError
    from rlinfra.placement.node_groups import (
        CLUSTER_GROUP,
        NODE_GROUP,
        EnvConfig,
        HardwareUnit,
        NodeGroup,
        NodeSpec,
    )
    from rlinfra.placement.record import VISIBILITY_ENV, Placement
    from rlinfra.placement.strategies import (
        FlexiblePlacementStrategy,
        NodePlacementStrategy,
        PackedPlacementStrategy,
        PlacementStrategy,
    )

# Loaded on first use: a worker process imports ``record`` and ``node_groups`` but never the
# config parser (and OmegaConf) behind ``ComponentPlacement``.
_EXPORTS = {
    "ClusterSpec": "rlinfra.placement.cluster_spec",
    "ComponentPlacement": "rlinfra.placement.component",
    "ClusterConfig": "rlinfra.placement.config",
    "ComponentConfig": "rlinfra.placement.config",
    "parse_cluster_config": "rlinfra.placement.config",
    "PlacementError": "rlinfra.placement.errors",
    "CLUSTER_GROUP": "rlinfra.placement.node_groups",
    "NODE_GROUP": "rlinfra.placement.node_groups",
    "EnvConfig": "rlinfra.placement.node_groups",
    "HardwareUnit": "rlinfra.placement.node_groups",
    "NodeGroup": "rlinfra.placement.node_groups",
    "NodeSpec": "rlinfra.placement.node_groups",
    "VISIBILITY_ENV": "rlinfra.placement.record",
    "Placement": "rlinfra.placement.record",
    "FlexiblePlacementStrategy": "rlinfra.placement.strategies",
    "NodePlacementStrategy": "rlinfra.placement.strategies",
    "PackedPlacementStrategy": "rlinfra.placement.strategies",
    "PlacementStrategy": "rlinfra.placement.strategies",
}

__all__ = [
    "CLUSTER_GROUP",
    "NODE_GROUP",
    "VISIBILITY_ENV",
    "ClusterConfig",
    "ClusterSpec",
    "ComponentConfig",
    "ComponentPlacement",
    "EnvConfig",
    "FlexiblePlacementStrategy",
    "HardwareUnit",
    "NodeGroup",
    "NodePlacementStrategy",
    "NodeSpec",
    "PackedPlacementStrategy",
    "Placement",
    "PlacementError",
    "PlacementStrategy",
    "parse_cluster_config",
]

__getattr__ = lazy_exports(__name__, _EXPORTS)
