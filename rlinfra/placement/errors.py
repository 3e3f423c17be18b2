"""The one error type of the placement layer.

Every bad input — a malformed placement string, an unknown node group, a config field of the
wrong type — becomes a ``PlacementError`` at parse time. The message says *where* (the component
or config path), *what* (the offending text, with a caret line under it when it is a string) and
*what was expected*, so a user can fix the YAML without reading our code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A half-open character range ``[start, end)`` inside a string the user wrote."""

    start: int
    end: int


class PlacementError(ValueError):
    """A placement or cluster description that cannot be honoured.

    Attributes mirror the message so that tools (the CLI, IDE integrations) can show them apart:
    ``where`` names the component or config path, ``text`` is the string the user wrote, ``span``
    marks the offending part of it, ``expected`` says what would have been accepted.
    """

    def __init__(
        self,
        problem: str,
        *,
        where: str | None = None,
        text: str | None = None,
        span: Span | None = None,
        expected: str | None = None,
    ) -> None:
        self.problem = problem
        self.where = where
        self.text = text
        self.span = span
        self.expected = expected
        super().__init__(self._render())

    def _render(self) -> str:
        head = f"{self.where}: {self.problem}" if self.where else self.problem
        lines = [head]
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

    def within(self, where: str) -> PlacementError:
        """The same error, attributed to ``where`` (used when a helper did not know its caller)."""
        return PlacementError(
            self.problem, where=where, text=self.text, span=self.span, expected=self.expected
        )


def short_ranks(ranks: list[int] | tuple[int, ...], limit: int = 6) -> str:
    """Render a rank list compactly (``0-7,9``), cut short on big clusters."""
    if not ranks:
        return "(none)"
    parts: list[str] = []
    start = prev = ranks[0]
    for r in ranks[1:]:
        if r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = r
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    if len(parts) > limit:
        return ",".join(parts[:limit]) + f",… ({len(ranks)} in all)"
    return ",".join(parts)
