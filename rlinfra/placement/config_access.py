"""Reading the user's config safely: plain containers, typed fields, rank lists.

Configs arrive as OmegaConf ``DictConfig`` (Hydra), plain dicts, or anything with attribute access.
These helpers turn them into plain Python values and check each field's type, so a wrong type is
a ``PlacementError`` that names the config path instead of an ``AttributeError`` deep inside.
"""

import posixpath
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rlinfra.config import Span, reject_unknown, to_plain
from rlinfra.placement.errors import PlacementError
from rlinfra.placement.grammar import ALL, comma_parts, parse_rank_range


def as_mapping(section: Any, where: str = "cluster", expected: str = "a YAML mapping") -> dict[str, Any]:
    """A config section as a plain dict, or a ``PlacementError`` naming it."""
    plain = to_plain(section)
    if not isinstance(plain, Mapping):
        raise PlacementError(
            f"expected a mapping, got {type(plain).__name__}", where=where, expected=expected
        )
    return dict(plain)


def require_int(value: Any, where: str, maximum: int | None = None) -> int:
    """A non-negative integer field (bools are not integers here), at most ``maximum``."""
    expected = "an integer >= 0" if maximum is None else f"an integer from 0 to {maximum:,}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlacementError(f"expected an integer, got {value!r}", where=where, expected=expected)
    if value < 0 or (maximum is not None and value > maximum):
        size = "small" if value < 0 else "large"
        raise PlacementError(f"{value:,} is too {size}", where=where, expected=expected)
    return value


def require_str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise PlacementError(f"expected a non-empty string, got {value!r}", where=where)
    return value.strip()


def require_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise PlacementError(f"expected true or false, got {value!r}", where=where)
    return value


def require_list(value: Any, where: str, expected: str) -> list[Any]:
    if not isinstance(value, list):
        raise PlacementError(f"expected a list, got {type(value).__name__}", where=where, expected=expected)
    return value


def absolute_path(value: Any, where: str, expected: str) -> str | None:
    """A path read on other machines (the nodes), where a relative one would name another file."""
    path = None if value is None else require_str(value, where)
    if path is not None and not posixpath.isabs(path):
        raise PlacementError(
            f"the path {path!r} is relative",
            where=where,
            text=path,
            span=Span(0, len(path)),
            expected=expected,
        )
    return path


def name_list(value: Any, where: str, what: str) -> tuple[str, ...]:
    """Names written as one string (commas separate several) or a YAML list, each non-empty and
    given once. YAML reads ``node_group: 4090`` as an int, so integers are names too."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise PlacementError(
            f"expected {what}s, got {value!r}",
            where=where,
            expected=f"a {what}, 'a,b', or a YAML list of them",
        )
    names = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int)) or not str(item).strip():
            raise PlacementError(
                f"bad {what} {item!r} in {value!r}",
                where=where,
                expected=f"non-empty {what}s separated by single commas",
            )
        names.append(str(item).strip())
    if len(set(names)) != len(names):
        raise PlacementError(
            f"a {what} is listed twice in {value!r}", where=where, expected=f"each {what} once"
        )
    return tuple(names)


def as_section(raw: Any, allowed: tuple[str, ...], where: str) -> dict[str, Any]:
    """A config mapping whose keys are all among ``allowed``."""
    section = as_mapping(raw, where)
    reject_unknown(section, allowed, where, error=PlacementError)
    return section


def parse_rank_list(
    value: Any, where: str, num_nodes: int, all_ranks: Sequence[int] | None = None
) -> list[int]:
    """Node ranks written as an int, a string like ``'0-3,6'``, a YAML list of either, or
    ``all`` in any case (as RLinf accepts): ``all_ranks``, by default every node.

    Returns the ranks in the order written; duplicates are an error, and so is a rank of
    ``num_nodes`` or more — checked before a range is expanded, so that a typo such as
    ``0-100000000000`` is an error rather than a hang. Messages name the list item, never echo
    the whole list (a 4,000-node list would bury the problem).
    """
    if isinstance(value, str) and value.strip().lower() == ALL:
        return list(all_ranks) if all_ranks is not None else list(range(num_nodes))
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise PlacementError("the list of ranks is empty", where=where, expected="at least one rank")
    within = f"node ranks within 0-{num_nodes - 1} (cluster.num_nodes is {num_nodes})"
    ranks: list[int] = []
    for index, item in enumerate(items):
        item_where = f"{where}[{index}]" if isinstance(value, (list, tuple)) else where
        if isinstance(item, int) and not isinstance(item, bool):
            item = str(require_int(item, item_where))  # read as the range it is, checked below
        if not isinstance(item, str):
            raise PlacementError(
                f"expected node ranks, got {item!r}",
                where=item_where,
                expected="an int, a range string such as '0-3,6', or a list of them",
            )
        for part, offset in comma_parts(item):
            rank_range = parse_rank_range(item, part, offset, item_where, what="node ranks")
            if rank_range.last >= num_nodes:
                raise PlacementError(
                    f"node rank {rank_range.last} does not exist",
                    where=item_where,
                    text=item,
                    span=rank_range.span,
                    expected=within,
                )
            ranks.extend(range(rank_range.first, rank_range.last + 1))
    repeated = [rank for rank, count in Counter(ranks).items() if count > 1]
    if repeated:
        raise PlacementError(
            f"node rank {repeated[0]} is listed twice",
            where=where,
            text=value if isinstance(value, str) else None,
            expected="each node rank once",
        )
    return ranks
