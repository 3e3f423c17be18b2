"""The one error type of bad config, and the one "did you mean".

The message says *where* (the component or config path), *what* (the offending text, with a caret
line under it when it is a string) and *what was expected*, so a user can fix the YAML without
reading our code. The placement layer's ``PlacementError`` and a job's ``JobConfigError`` are
kinds of it; the CLI answers any of them with exit status 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Span:
    """A half-open character range ``[start, end)`` inside a string the user wrote."""

    start: int
    end: int


@dataclass(eq=False, repr=False)
class ConfigError(ValueError):
    """A config that cannot be used as written.

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

    def within(self, where: str | None) -> ConfigError:
        """The same error, attributed to ``where`` (used when a helper did not know its caller)."""
        return replace(self, where=where)


class JobConfigError(ConfigError):
    """A mistake in a job's own sections (``algo``, ``run`` …), said as the cluster's are."""


def did_you_mean(key: str, allowed: Sequence[str]) -> str:
    """``"did you mean 'node_groups'?"`` for the valid name nearest to ``key``, else ``""``: the
    one typo hint of every config error, rlinfra's sections and a job's alike."""
    nearest = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
    return f"did you mean {nearest[0]!r}?" if nearest else ""


def reject_unknown(
    section: Mapping[str, Any],
    allowed: tuple[str, ...] | list[str],
    where: str | None,
    kind: str = "key",
    error: type[ConfigError] = ConfigError,
) -> None:
    """A typo in a key would otherwise be silently ignored: name the first unknown key, and the
    nearest valid one (``node_grups`` → ``node_groups``)."""
    unknown = [str(key) for key in section if key not in allowed]
    if unknown:
        raise unknown_key(unknown[0], allowed, where, kind, error)


def unknown_key(
    key: str,
    allowed: Sequence[str],
    where: str | None,
    kind: str = "key",
    error: type[ConfigError] = ConfigError,
) -> ConfigError:
    """The one error of an unknown key: named, with the nearest valid one and every valid one."""
    hint = did_you_mean(key, allowed)
    return error(
        f"unknown {kind} {key!r}" + (f"; {hint}" if hint else ""),
        where=where,
        expected="one of " + ", ".join(repr(name) for name in allowed),
    )
