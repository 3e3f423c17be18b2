"""The pure placement layer: config → cluster description → per-process ``Placement`` records.

No Ray, torch or numpy here and no I/O, so everything can be planned and tested without a cluster.
"""

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
