"""The one error type of the placement layer.

Every bad input — a malformed placement string, an unknown node group, a config field of the
wrong type — becomes a ``PlacementError`` at parse time. The message says *where* (the component
or config path), *what* (the offending text, with a caret line under it when it is a string) and
*what was expected*, so a user can fix the YAML without reading our code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, replace
from itertools import groupby


@dataclass(frozen=True)
class Span:
    """A half-open character range ``[start, end)`` inside a string the user wrote."""

    start: int
    end: int


@dataclass(eq=False, repr=False)
class PlacementError(ValueError):
    """A placement or cluster description that cannot be honoured.

    Attributes mirror the message so that tools (the CLI, IDE integrations) can show them apart:
    ``where`` names the component or config path, ``text`` is the string the user wrote, ``span``
    marks the offending part of it, ``expected`` says what would have been accepted.
    """

    problem: str
    _: KW_ONLY
    where: str | None = None
    text: str | None = None
    span: Span | None = None
    expected: str | None = None

    def __post_init__(self) -> None:
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [f"{self.where}: {self.problem}" if self.where else self.problem]
        if self.text is not None:
            label = "  in: "
            # Tabs, newlines and other control characters would break the line or shift the caret
            # off the characters it marks; one space each keeps every column where it was.
            shown = "".join(char if char.isprintable() else " " for char in self.text)
            lines.append(f"{label}{shown}")
            if self.span is not None:
                width = max(1, self.span.end - self.span.start)
                lines.append(" " * (len(label) + self.span.start) + "^" * width)
        if self.expected:
            lines.append(f"  expected: {self.expected}")
        return "\n".join(lines)

    def within(self, where: str | None) -> PlacementError:
        """The same error, attributed to ``where`` (used when a helper did not know its caller)."""
        return replace(self, where=where)


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
