"""Samples stamped with the weight version that produced them, and the staleness bound.

Off-policy drift is bounded by how old the weights behind a sample may be: the trainer at
version v accepts samples from versions ``v - max_staleness`` .. ``v`` and drops the rest.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Stamped(Generic[T]):
    """A value produced with weights of ``version``."""

    version: int
    value: T


def filter_stale(samples: Iterable[Any], current_version: int, max_staleness: int) -> tuple[list[Any], int]:
    """``(fresh samples, number dropped)``; a sample's version is its ``version`` attribute."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    fresh, dropped = [], 0
    for sample in samples:
        if current_version - sample.version <= max_staleness:
            fresh.append(sample)
        else:
            dropped += 1
    return fresh, dropped
