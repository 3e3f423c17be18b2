"""rlinfra: placement, launch, ordering and visible errors for RL systems on Ray.

The placement layer imports no Ray; the runtime names (``Cluster``, ``Worker`` …) are loaded on
first use so that ``rlinfra plan`` and pure planning code stay light. The names are RLinf's
(``rlinf.scheduler``), so an RLinf driver moves over by changing its imports.
"""

from rlinfra.lazy_exports import lazy_exports
from rlinfra.placement import (
    ComponentPlacement,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    Placement,
    PlacementError,
    PlacementStrategy,
)

__version__ = "0.1.0"

_RUNTIME_NAMES = (
    "Cluster",
    "ClusterError",
    "GroupCall",
    "Layout",
    "RankFailure",
    "ReservationError",
    "TimeShared",
    "TimeSharing",
    "Worker",
    "WorkerAddress",
    "WorkerGroup",
    "WorkerGroupError",
    "fuse",
)

__all__ = [
    "ComponentPlacement",
    "FlexiblePlacementStrategy",
    "NodePlacementStrategy",
    "PackedPlacementStrategy",
    "Placement",
    "PlacementError",
    "PlacementStrategy",
    *_RUNTIME_NAMES,
]

# What a worker class of a job mixes in to send or receive weight versions.
_WEIGHT_ROLES = ("EngineReceiver", "WeightReceiver", "WeightSender", "WeightsView")

__all__ += _WEIGHT_ROLES

__getattr__ = lazy_exports(
    __name__,
    dict.fromkeys(_RUNTIME_NAMES, "rlinfra.runtime")
    | dict.fromkeys(_WEIGHT_ROLES, "rlinfra.services.weights"),
)
