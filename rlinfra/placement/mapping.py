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

from __future__ import annotations

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
        if _all_nodes(pool, first, last):
            assigned.extend(_spread_on_nodes(first, num_resources, num_processes, fail, segment))
        else:
            assigned.extend(
                _share_devices(first, num_resources, num_processes, pool, fail, segment, next_process)
            )
    return assigned


def _spread_on_nodes(
    first: int, num_resources: int, num_processes: int, fail: _Fail, segment: Segment
) -> list[tuple[int, ...]]:
    if num_processes < num_resources:
        raise fail(
            f"{num_resources} nodes for {num_processes} process(es): a process runs on one node",
            segment.span,
            f"at least {num_resources} processes, or fewer nodes",
        )
    base, extra = divmod(num_processes, num_resources)
    out: list[tuple[int, ...]] = []
    for offset in range(num_resources):
        out.extend([(first + offset,)] * (base + (offset < extra)))
    return out


def _share_devices(
    first: int,
    num_resources: int,
    num_processes: int,
    pool: ResourcePool,
    fail: _Fail,
    segment: Segment,
    first_process: int,
) -> list[tuple[int, ...]]:
    kind = pool.kind
    if num_processes >= num_resources:
        if num_processes % num_resources:
            raise fail(
                f"{num_processes} processes cannot share {num_resources} {kind}s evenly",
                segment.span,
                f"a process count that is a multiple or a divisor of {num_resources}",
            )
        share = num_processes // num_resources
        out: list[tuple[int, ...]] = []
        for offset in range(num_resources):
            out.extend([(first + offset,)] * share)
        return out
    if num_resources % num_processes:
        raise fail(
            f"{num_resources} {kind}s cannot be split evenly among {num_processes} processes",
            segment.span,
            f"a process count that is a multiple or a divisor of {num_resources}",
        )
    width = num_resources // num_processes
    out = []
    node_of, kind_of = pool.node_of, pool.kind_of
    for index in range(num_processes):
        start = first + index * width
        end = start + width - 1
        if node_of[start] != node_of[end]:
            raise fail(
                f"process {first_process + index} would own {kind}s {start}-{end}, which span "
                f"nodes {node_of[start]} and {node_of[end]}",
                segment.resources_span,
                f"groups of {width} {kind}s that each lie on one node",
            )
        mixed = sorted(set(kind_of[start : end + 1]))
        if len(mixed) > 1:
            raise fail(
                f"process {first_process + index} would own resources {start}-{end} of different "
                f"kinds ({', '.join(mixed)})",
                segment.resources_span,
                f"groups of {width} resources of one kind per process",
            )
        out.append(tuple(range(start, end + 1)))
    return out


def _all_nodes(pool: ResourcePool, first: int, last: int) -> bool:
    """Whether resources ``first..last`` are all whole nodes (they follow the node rule)."""
    if pool.is_node:
        return True
    if NODE_KIND not in pool.kinds:
        return False
    return all(kind == NODE_KIND for kind in pool.kind_of[first : last + 1])
