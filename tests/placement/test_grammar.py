"""The placement-string grammar on its own: tokens, ranges, spans and syntax errors."""

from __future__ import annotations

import pytest

from rlinfra.placement.config_access import parse_rank_list
from rlinfra.placement.errors import PlacementError, Span
from rlinfra.placement.grammar import MAX_DIGITS, bounded_int, parse_placement

PREFIX = len("  in: ")


def caret(error: PlacementError) -> tuple[int, int]:
    """(column inside the user's text, width) of the caret line of a rendered error."""
    lines = [line for line in str(error).splitlines() if line.strip() and set(line.strip()) == {"^"}]
    assert len(lines) == 1, str(error)
    line = lines[0]
    start = len(line) - len(line.lstrip())
    return start - PREFIX, len(line.strip())


def parse_error(text: str) -> PlacementError:
    with pytest.raises(PlacementError) as info:
        parse_placement(text, "component 'actor'")
    return info.value


def ranges(text: str) -> list[tuple[tuple[int, int] | None, tuple[int, int] | None]]:
    out = []
    for segment in parse_placement(text, "c"):
        res = None if segment.resources is None else (segment.resources.first, segment.resources.last)
        proc = None if segment.processes is None else (segment.processes.first, segment.processes.last)
        out.append((res, proc))
    return out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", [((0, 0), None)]),
        ("0-7", [((0, 7), None)]),
        ("3-3", [((3, 3), None)]),
        ("all", [(None, None)]),
        ("ALL", [(None, None)]),
        (" All ", [(None, None)]),
        ("all:0-15", [(None, (0, 15))]),
        ("0-3:0-7", [((0, 3), (0, 7))]),
        ("0-3,4-7", [((0, 3), None), ((4, 7), None)]),
        ("0-1:0-3,3-5,7-10:7-14", [((0, 1), (0, 3)), ((3, 5), None), ((7, 10), (7, 14))]),
        ("0-1:0-200,2-3:201-511", [((0, 1), (0, 200)), ((2, 3), (201, 511))]),
        (" 0 - 3 : 0 - 7 , 8 ", [((0, 3), (0, 7)), ((8, 8), None)]),
        ("007", [((7, 7), None)]),
        ("0" * 5000 + "1:0-1", [((1, 1), (0, 1))]),
        ("0-3\t:\t4", [((0, 3), (4, 4))]),
    ],
)
def test_accepted_strings(text: str, expected: list) -> None:
    assert ranges(text) == expected


def test_spans_point_at_the_written_characters() -> None:
    text = "0-1:0-3, 3-5 ,7-10:7-14"
    segments = parse_placement(text, "c")
    assert [text[s.span.start : s.span.end] for s in segments] == ["0-1:0-3", "3-5", "7-10:7-14"]
    assert [text[s.resources_span.start : s.resources_span.end] for s in segments] == ["0-1", "3-5", "7-10"]
    procs = [s.processes for s in segments]
    assert procs[1] is None
    assert text[procs[0].span.start : procs[0].span.end] == "0-3"
    assert text[procs[2].span.start : procs[2].span.end] == "7-14"


def test_all_records_its_span() -> None:
    text = "all"
    (segment,) = parse_placement(text, "c")
    assert segment.resources is None
    assert segment.resources_span == Span(0, 3)


def test_rank_range_count() -> None:
    (segment,) = parse_placement("2-5:0-11", "c")
    assert segment.resources.count == 4
    assert segment.processes.count == 12


@pytest.mark.parametrize(
    ("text", "problem", "column", "width"),
    [
        ("", "empty", 0, 1),
        ("   ", "empty", 0, 3),
        (",0", "empty segment", 0, 1),
        ("0,", "empty segment", 2, 1),
        ("0,,1", "empty segment", 2, 1),
        ("0, ,1", "empty segment", 2, 1),
        ("a-b", "cannot read resource ranks 'a-b'", 0, 3),
        ("0-3,x", "cannot read resource ranks 'x'", 4, 1),
        ("-1", "cannot read resource ranks '-1'", 0, 2),
        ("1-", "cannot read resource ranks '1-'", 0, 2),
        ("1.5", "cannot read resource ranks '1.5'", 0, 3),
        ("0-3 4", "cannot read resource ranks '0-3 4'", 0, 5),
        ("0-3:1-2-3", "cannot read process ranks '1-2-3'", 4, 5),
        ("0-3:0-3:5", "cannot read process ranks '0-3:5'", 4, 5),
        ("0-3:", "missing process ranks", 4, 1),
        (":0-3", "missing resource ranks", 0, 1),
        ("7-3", "resource ranks range '7-3' runs backwards", 0, 3),
        ("0-3:7-0", "process ranks range '7-0' runs backwards", 4, 3),
        ("0-3:all", "'all' is only allowed for resource ranks", 4, 3),
        ("0-3, all : ALL", "'all' is only allowed for resource ranks", 11, 3),
        ("allx", "cannot read resource ranks 'allx'", 0, 4),
    ],
)
def test_syntax_errors_put_the_caret_under_the_offending_text(
    text: str, problem: str, column: int, width: int
) -> None:
    error = parse_error(text)
    assert problem in error.problem
    assert error.where == "component 'actor'"
    assert error.text == text
    assert error.expected
    assert caret(error) == (column, width)
    assert str(error).startswith(f"component 'actor': {error.problem}\n  in: {text}\n")
    assert str(error).splitlines()[-1].startswith("  expected: ")


def test_backwards_range_suggests_the_fix() -> None:
    assert "did you mean '3-7'?" in parse_error("7-3").expected


def test_resource_hint_mentions_all_but_process_hint_does_not() -> None:
    assert "'all'" in parse_error("x").expected
    assert "'all'" not in parse_error("0:x").expected


@pytest.mark.parametrize("text", ["9" * 5000, "0-" + "1" * 4400, "0:" + "1" * 5000, "1" * 19])
def test_absurdly_long_numbers_are_placement_errors(text: str) -> None:
    error = parse_error(text)
    assert "too large" in error.problem
    assert f"at most {MAX_DIGITS} digits" in error.expected


def test_bounded_int() -> None:
    assert bounded_int("0") == 0
    assert bounded_int("000") == 0
    assert bounded_int("0042") == 42
    assert bounded_int("9" * MAX_DIGITS) == int("9" * MAX_DIGITS)
    assert bounded_int("0" * 5000 + "1") == 1
    assert bounded_int("1" + "0" * MAX_DIGITS) is None


class TestRankList:
    """``node_ranks`` (node groups and env_configs): int, range string, or a list of either."""

    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            (3, [3]),
            ("3", [3]),
            ("0-1,3", [0, 1, 3]),
            (" 0 - 1 , 3 ", [0, 1, 3]),
            ([3, 0, 1], [3, 0, 1]),
            (["0-1", 3], [0, 1, 3]),
            (("4-5",), [4, 5]),
            (["0-1,3", "5"], [0, 1, 3, 5]),
        ],
    )
    def test_forms(self, value: object, expected: list[int]) -> None:
        assert parse_rank_list(value, "g.node_ranks", 8) == expected

    @pytest.mark.parametrize(
        ("value", "where", "problem"),
        [
            (None, "g.node_ranks", "expected node ranks, got None"),
            (True, "g.node_ranks", "expected node ranks, got True"),
            ([], "g.node_ranks", "empty"),
            ([1.5], "g.node_ranks[0]", "expected node ranks, got 1.5"),
            ([0, [1]], "g.node_ranks[1]", "expected node ranks, got [1]"),
            ([0, -1], "g.node_ranks[1]", "too small"),
            ("0-1,1", "g.node_ranks", "node rank 1 is listed twice"),
            ([0, "0-2"], "g.node_ranks", "node rank 0 is listed twice"),
            ("0-x", "g.node_ranks", "cannot read node ranks '0-x'"),
            ("", "g.node_ranks", "missing node ranks"),
            (8, "g.node_ranks", "node rank 8 does not exist"),
            ([0, 9], "g.node_ranks[1]", "node rank 9 does not exist"),
            ("0-1,6-100", "g.node_ranks", "node rank 100 does not exist"),
        ],
    )
    def test_errors(self, value: object, where: str, problem: str) -> None:
        with pytest.raises(PlacementError) as info:
            parse_rank_list(value, "g.node_ranks", 8)
        assert info.value.where == where
        assert problem in info.value.problem

    def test_range_past_the_cluster_points_at_it(self) -> None:
        with pytest.raises(PlacementError) as info:
            parse_rank_list("0-1,6-100", "g.node_ranks", 8)
        assert caret(info.value) == (4, 5)
        assert info.value.expected == "node ranks within 0-7 (cluster.num_nodes is 8)"

    def test_huge_range_fails_fast_instead_of_expanding(self) -> None:
        with pytest.raises(PlacementError, match="does not exist"):
            parse_rank_list("0-999999999999999", "g.node_ranks", 4)
