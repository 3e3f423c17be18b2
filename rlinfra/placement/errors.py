"""The error type of the placement layer, and the helpers its messages share.

Every bad input — a malformed placement string, an unknown node group, a config field of the
wrong type — becomes a ``PlacementError`` at parse time: a ``ConfigError`` (where, what, what was
expected), so a user can fix the YAML without reading our code.
"""

from collections.abc import Sequence
from itertools import groupby

from rlinfra.config.errors import ConfigError, Span

__all__ = ["PlacementError", "Span", "plural", "rank_runs", "short_ranks"]


class PlacementError(ConfigError):
    """A placement or cluster description that cannot be honoured."""


def plural(count: int, noun: str) -> str:
    """``1 node``, ``2 nodes``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def rank_runs(ranks: Sequence[int]) -> list[list[int]]:
    """Consecutive ranks as runs: ``[0, 1, 2, 5]`` → ``[[0, 1, 2], [5]]``."""
    # Consecutive ranks share ``rank - index``: each group is one run.
    grouped = groupby(enumerate(ranks), key=lambda pair: pair[1] - pair[0])
    return [[rank for _, rank in run] for _, run in grouped]


def short_ranks(ranks: Sequence[int], limit: int = 6, unit: str = "in all") -> str:
    """Render a rank list compactly (``0-7,9``): its first ``limit`` runs, then the count
    (``,… (40 in all)``) when there are more, as on big clusters."""
    if not ranks:
        return "(none)"
    parts = [f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in rank_runs(ranks)]
    if len(parts) > limit:
        return ",".join(parts[:limit]) + f",… ({len(ranks)} {unit})"
    return ",".join(parts)
