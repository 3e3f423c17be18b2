"""From parsed segments to the resources of each process.

This is where the placement rules live (see DESIGN "Placement semantics"):

* process ranks over all segments are exactly ``0..N-1`` in order — an omitted ``:processes``
  continues the numbering;
* resource ranks ascend without repeats and exist in the node groups;
* on devices (accelerators, custom hardware) a segment of R resources and P processes needs
  ``P % R == 0`` (P/R processes share a device) or ``R % P == 0`` (a process owns R/P contiguous
  devices, all on one node);
* on nodes any P >= R works: processes are spread as evenly as possible, in order;
* a process's resources are of one kind (a pool may concatenate GPUs and robots: a segment mixing
  kinds follows the device rule, and one process never owns two kinds).

The output is one tuple of resource ranks per process, the input of every strategy.
"""

from collections.abc import Callable

from rlinfra.placement.errors import PlacementError, Span
from rlinfra.placement.grammar import Segment
from rlinfra.placement.node_groups import NODE_KIND
from rlinfra.placement.resources import ResourcePool

MAX_PROCESSES = 1_000_000

_Fail = Callable[[str, Span, str], PlacementError]


def assign_resources(
    segments: list[Segment], pool: ResourcePool, text: str, where: str
) -> list[tuple[int, ...]]:
    """Resources of each process, in rank order; ``PlacementError`` with a caret on any violation."""

    def fail(problem: str, span: Span, expected: str) -> PlacementError:
        return PlacementError(problem, where=where, text=text, span=span, expected=expected)

    if pool.size == 0:
        raise PlacementError(
            f"there are no {pool.kind} resources to place on ({pool.description})",
            where=where,
            text=text,
            expected="node groups that have accelerators, hardware units or nodes",
        )
    assigned: list[tuple[int, ...]] = []
    last_resource = -1
    for segment in segments:
        if segment.resources is None:
            first, last = 0, pool.size - 1
        else:
            first, last = segment.resources.first, segment.resources.last
            if last >= pool.size:
                raise fail(
                    f"{pool.kind} rank {last} does not exist: {pool.description}",
                    segment.resources_span,
                    f"{pool.kind} ranks within 0-{pool.size - 1}, or 'all'",
                )
        if first <= last_resource:
            raise fail(
                f"{pool.kind} ranks must ascend without repeats, but {first} follows {last_resource}",
                segment.resources_span,
                f"{pool.kind} ranks from {last_resource + 1} on in this segment",
            )
        last_resource = last
        num_resources = last - first + 1

        next_process = len(assigned)
        if segment.processes is None:
            num_processes = num_resources
        else:
            if segment.processes.first != next_process:
                gap_or_repeat = "repeats" if segment.processes.first < next_process else "skips"
                raise fail(
                    f"process ranks must be 0..N-1 in order; this segment {gap_or_repeat} ranks "
                    f"(starts at {segment.processes.first})",
                    segment.processes.span,
                    f"process ranks starting at {next_process}",
                )
            num_processes = segment.processes.count
        if next_process + num_processes > MAX_PROCESSES:
            raise fail(
                f"more than {MAX_PROCESSES:,} processes in one component",
                segment.span,
                "a smaller process range",
            )
        assigned.extend(_segment(first, num_resources, num_processes, pool, fail, segment, next_process))
    return assigned


def _spread(first: int, num_resources: int, num_processes: int) -> list[tuple[int, ...]]:
    """Processes over resources ``first..``, in order, as evenly as possible (earlier ones get one more)."""
    base, extra = divmod(num_processes, num_resources)
    out: list[tuple[int, ...]] = []
    for offset in range(num_resources):
        out.extend([(first + offset,)] * (base + (offset < extra)))
    return out


def _segment(
    first: int,
    num_resources: int,
    num_processes: int,
    pool: ResourcePool,
    fail: _Fail,
    segment: Segment,
    first_process: int,
) -> list[tuple[int, ...]]:
    """The resources of one segment's processes, by the node rule or the device rule."""
    kind = pool.kind
    if _all_nodes(pool, first, first + num_resources - 1):
        if num_processes < num_resources:
            raise fail(
                f"{num_resources} nodes for {num_processes} process(es): a process runs on one node",
                segment.span,
                f"at least {num_resources} processes, or fewer nodes",
            )
        return _spread(first, num_resources, num_processes)
    if num_processes >= num_resources:
        if num_processes % num_resources:
            raise fail(
                f"{num_processes} processes cannot share {num_resources} {kind}s evenly",
                segment.span,
                f"a process count that is a multiple or a divisor of {num_resources}",
            )
        return _spread(first, num_resources, num_processes)
    if num_resources % num_processes:
        raise fail(
            f"{num_resources} {kind}s cannot be split evenly among {num_processes} processes",
            segment.span,
            f"a process count that is a multiple or a divisor of {num_resources}",
        )
    width = num_resources // num_processes
    out = [tuple(range(start, start + width)) for start in range(first, first + num_resources, width)]
    problem = pool.first_problem(out, first_process)
    if problem is not None:
        expected = f"groups of {width} {kind}s that each lie on one node and are of one kind"
        raise fail(problem[0], segment.resources_span, expected)
    return out


def _all_nodes(pool: ResourcePool, first: int, last: int) -> bool:
    """Whether resources ``first..last`` are all whole nodes (they follow the node rule)."""
    if NODE_KIND not in pool.kinds:
        return False
    return pool.is_node or all(kind == NODE_KIND for kind in pool.kind_of[first : last + 1])
