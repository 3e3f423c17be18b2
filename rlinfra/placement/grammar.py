"""The placement-string grammar, and nothing else.

::

    placement := segment ("," segment)*
    segment   := resources [":" processes]
    resources := range | "all"
    processes := range
    range     := INT | INT "-" INT          (inclusive, a <= b)

Whitespace around tokens is allowed. This module knows no cluster: it turns text into
``Segment`` records that remember where each part came from, so later stages can put a caret
under the exact characters they reject.
"""

import re
from dataclasses import dataclass
from itertools import accumulate

from rlinfra.placement.errors import PlacementError, Span

ALL = "all"
# Far beyond any cluster, and far below the 4,300 digits past which ``int()`` raises a bare
# ValueError (CPython's guard against quadratic conversions).
MAX_DIGITS = 18

_RANGE = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?$")


@dataclass(frozen=True)
class RankRange:
    """An inclusive range ``first..last`` of ranks written by the user at ``span``."""

    first: int
    last: int
    span: Span

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True)
class Segment:
    """One ``resources[:processes]`` entry. ``resources`` is None for ``all``."""

    resources: RankRange | None
    processes: RankRange | None
    resources_span: Span
    span: Span


def parse_placement(text: str, where: str) -> list[Segment]:
    """Parse ``text`` into segments; raise ``PlacementError`` (naming ``where``) on any bad token."""
    if not text.strip():
        raise PlacementError(
            "the placement string is empty",
            where=where,
            text=text,
            span=Span(0, len(text)),
            expected="resource ranks such as '0-7' or 'all', optionally ':process ranks'",
        )
    return [_parse_segment(text, raw, offset, where) for raw, offset in comma_parts(text)]


def comma_parts(text: str) -> list[tuple[str, int]]:
    """``text`` split at commas, each part with its offset in ``text`` (where its caret goes)."""
    parts = text.split(",")
    offsets = accumulate((len(part) + 1 for part in parts[:-1]), initial=0)
    return list(zip(parts, offsets, strict=True))


def _parse_segment(text: str, raw: str, offset: int, where: str) -> Segment:
    span = _trimmed_span(raw, offset)
    if span.start == span.end:
        raise PlacementError(
            "empty segment (two commas in a row, or a comma at an end)",
            where=where,
            text=text,
            span=Span(offset, offset + max(1, len(raw))),
            expected="a segment 'resources[:processes]' between commas",
        )
    resource_part, colon, process_part = raw.partition(":")
    resources_span = _trimmed_span(resource_part, offset)
    if resource_part.strip().lower() == ALL:
        resources = None
    else:
        resources = parse_rank_range(text, resource_part, offset, where, what="resource ranks")
    processes = None
    if colon:
        process_offset = offset + len(resource_part) + 1
        if process_part.strip().lower() == ALL:
            raise PlacementError(
                "'all' is only allowed for resource ranks",
                where=where,
                text=text,
                span=_trimmed_span(process_part, process_offset),
                expected="process ranks as a number or a range such as '0-7'",
            )
        processes = parse_rank_range(text, process_part, process_offset, where, what="process ranks")
    return Segment(resources, processes, resources_span, span)


def parse_rank_range(text: str, part: str, offset: int, where: str, what: str) -> RankRange:
    """Read one `a` or `a-b` range from `part`, which starts at `offset` inside `text`."""
    span = _trimmed_span(part, offset)
    written = part.strip()

    def fail(problem: str, expected: str) -> PlacementError:
        shown = span if span.end > span.start else Span(offset, offset + 1)
        return PlacementError(problem, where=where, text=text, span=shown, expected=expected)

    match = _RANGE.match(part)
    if match is None:
        hint = "'all', " if what == "resource ranks" else ""
        raise fail(
            f"cannot read {what} {written!r}" if written else f"missing {what}",
            f"{hint}a non-negative integer 'a' or an inclusive range 'a-b' with a <= b",
        )
    first = bounded_int(match.group(1))
    last = bounded_int(match.group(2)) if match.group(2) is not None else first
    if first is None or last is None:
        raise fail(f"{what} {written!r} is too large", f"numbers of at most {MAX_DIGITS} digits")
    if last < first:
        raise fail(
            f"{what} range {written!r} runs backwards",
            f"an inclusive range 'a-b' with a <= b (did you mean '{last}-{first}'?)",
        )
    return RankRange(first, last, span)


def bounded_int(digits: str) -> int | None:
    """``int(digits)`` for a string of ASCII digits, or None when it has more than ``MAX_DIGITS``
    significant digits (so absurd input is a ``PlacementError``, not Python's digit-limit error)."""
    significant = digits.strip().lstrip("0")
    return None if len(significant) > MAX_DIGITS else int(significant or "0")


def _trimmed_span(part: str, offset: int) -> Span:
    """The span of ``part`` without surrounding whitespace; empty (not inverted) if it is blank."""
    end = offset + len(part.rstrip())
    return Span(min(offset + len(part) - len(part.lstrip()), end), end)
