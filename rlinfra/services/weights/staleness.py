"""The staleness bound on samples, each stamped with the weight ``version`` that produced it.

Off-policy drift is bounded by how old the weights behind a sample may be: the trainer at
version v accepts samples from versions ``v - max_staleness`` .. ``v`` and drops the rest.
"""

from collections.abc import Iterable
from typing import Any


def filter_stale(samples: Iterable[Any], current_version: int, max_staleness: int) -> tuple[list[Any], int]:
    """``(fresh samples, number dropped)``; a sample's version is its ``version`` attribute."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    samples = list(samples)
    fresh = [sample for sample in samples if current_version - sample.version <= max_staleness]
    return fresh, len(samples) - len(fresh)
