"""rlinfra: placement, launch, ordering and visible errors for RL systems on Ray."""

from rlinfra.placement import ComponentPlacement, PlacementError

__all__ = ["ComponentPlacement", "PlacementError"]
__version__ = "0.1.0"
