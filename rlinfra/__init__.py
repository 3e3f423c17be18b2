"""rlinfra: placement, launch, ordering and visible errors for RL systems on Ray.

The placement layer imports no Ray; the runtime names (``Cluster``, ``Worker`` …) are loaded on
first use so that ``rlinfra plan`` and pure planning code stay light. The names are RLinf's
(``rlinf.scheduler``), so an RLinf driver moves over by changing its imports.
"""

from typing import Any

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


def __getattr__(name: str) -> Any:
    if name in _RUNTIME_NAMES:
        from rlinfra import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'rlinfra' has no attribute {name!r}")
