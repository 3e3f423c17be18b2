"""rlinfra: placement, launch, ordering and visible errors for RL systems on Ray.

The placement layer imports no Ray. Every name (``ComponentPlacement``, ``Cluster``, ``Worker``
…) is loaded on first use, so ``rlinfra plan``, pure planning code and workers stay light. The
names are RLinf's (``rlinf.scheduler``), so an RLinf driver moves over by changing its imports.
"""

from typing import TYPE_CHECKING

from rlinfra.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from rlinfra.placement import ComponentPlacement as ComponentPlacement
    from rlinfra.placement import FlexiblePlacementStrategy as FlexiblePlacementStrategy
    from rlinfra.placement import NodePlacementStrategy as NodePlacementStrategy
    from rlinfra.placement import PackedPlacementStrategy as PackedPlacementStrategy
    from rlinfra.placement import Placement as Placement
    from rlinfra.placement import PlacementError as PlacementError
    from rlinfra.placement import PlacementStrategy as PlacementStrategy

__version__ = "0.1.0"

_RUNTIME_NAMES = (
    "Cluster", "ClusterError", "GroupCall", "Layout", "RankFailure", "ReservationError", "TimeShared",
    "TimeSharing", "Worker", "WorkerAddress", "WorkerGroup", "WorkerGroupError", "fuse",
)  # fmt: skip

_PLACEMENT_NAMES = (
    "ComponentPlacement", "FlexiblePlacementStrategy", "NodePlacementStrategy", "PackedPlacementStrategy",
    "Placement", "PlacementError", "PlacementStrategy",
)  # fmt: skip

# What a worker class of a job mixes in to send or receive weight versions.
_WEIGHT_ROLES = ("EngineReceiver", "WeightReceiver", "WeightSender", "WeightsView")

__all__ = [*_PLACEMENT_NAMES, *_RUNTIME_NAMES, *_WEIGHT_ROLES]

# Every name is loaded on first use: a worker process that imports ``Worker`` never loads the
# config parser, and ``rlinfra plan`` never loads Ray.
__getattr__ = lazy_exports(
    __name__,
    dict.fromkeys(_PLACEMENT_NAMES, "rlinfra.placement")
    | dict.fromkeys(_RUNTIME_NAMES, "rlinfra.runtime")
    | dict.fromkeys(_WEIGHT_ROLES, "rlinfra.services.weights"),
)
