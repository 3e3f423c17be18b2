"""``WorkerAddress``: a worker's name as a path, ``group:rank`` (``group:rank:child`` below it).

RLinf drivers and workers pass these around to name peers (channels, collectives, logs), so the
spelling is RLinf's: a root group name without ``:``, then one ``:rank`` per level. rlinfra names
its Ray actors the same way (``rollout:3``), so an address is also how to find an actor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SEPARATOR = ":"


@dataclass(frozen=True, order=True, init=False, repr=False)
class WorkerAddress:
    """The path to a worker: ``root_group_name`` and the ranks below it (``rank`` is the last).
    A value: equal, ordered and hashed by its path."""

    root_group_name: str
    rank_path: tuple[int, ...]

    def __init__(self, root_group_name: str, ranks: int | Sequence[int] = ()) -> None:
        if not root_group_name or SEPARATOR in root_group_name:
            raise ValueError(f"a group name is non-empty and has no {SEPARATOR!r}: {root_group_name!r}")
        path = (ranks,) if isinstance(ranks, int) else tuple(ranks)
        if any(isinstance(rank, bool) or not isinstance(rank, int) or rank < 0 for rank in path):
            raise ValueError(f"ranks are non-negative ints, got {ranks!r}")
        object.__setattr__(self, "root_group_name", root_group_name)
        object.__setattr__(self, "rank_path", path)

    @property
    def rank(self) -> int:
        """The worker's rank in its own group (0 for the root)."""
        return self.rank_path[-1] if self.rank_path else 0

    def get_name(self) -> str:
        """``group:rank`` — the name rlinfra gives the worker's Ray actor."""
        return SEPARATOR.join([self.root_group_name, *map(str, self.rank_path)])

    def get_parent_address(self) -> WorkerAddress | None:
        """The address one level up, or None for the root group itself."""
        return WorkerAddress(self.root_group_name, self.rank_path[:-1]) if self.rank_path else None

    def get_child_address(self, rank: int) -> WorkerAddress:
        return WorkerAddress(self.root_group_name, [*self.rank_path, rank])

    @classmethod
    def from_name(cls, name: str) -> WorkerAddress:
        """Parse ``group:rank[:rank…]``; a malformed name is a ``ValueError`` saying what is wrong."""
        root, *ranks = name.split(SEPARATOR)
        if not all(rank.isdigit() for rank in ranks):
            raise ValueError(f"worker name {name!r}: expected 'group:rank', ranks as numbers")
        return cls(root, [int(rank) for rank in ranks])

    def __repr__(self) -> str:
        return f"WorkerAddress({self.get_name()!r})"

    def __str__(self) -> str:
        return self.get_name()
