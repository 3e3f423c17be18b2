"""rlinfra: placement, launch, ordering and visible errors for RL systems on Ray.

The placement layer imports no Ray; the runtime names (``Cluster``, ``Worker`` …) are loaded on
first use so that ``rlinfra plan`` and pure planning code stay light.
"""

from typing import Any

from rlinfra.placement import ComponentPlacement, PlacementError

__version__ = "0.1.0"

_RUNTIME_NAMES = (
    "Cluster",
    "ClusterError",
    "GroupCall",
    "Layout",
    "RankFailure",
    "ReservationError",
    "Worker",
    "WorkerGroup",
    "WorkerGroupError",
    "fuse",
)

__all__ = ["ComponentPlacement", "PlacementError", *_RUNTIME_NAMES]


def __getattr__(name: str) -> Any:
    if name in _RUNTIME_NAMES:
        from rlinfra import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'rlinfra' has no attribute {name!r}")
