"""What the launch benchmarks start on both sides: a no-op rlinfra worker and a no-op raw Ray
actor, and the common end of a raw run (wait for every actor's first answer, then clean up)."""

from __future__ import annotations

import time

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from rlinfra import Worker


class Noop(Worker):
    def ping(self) -> int:
        return self._rank


@ray.remote
class RawNoop:
    def ping(self) -> int:
        return 0


def ready_then_release(started: float, actors: list, pg: PlacementGroup, timeout_s: float) -> float:
    """Seconds from ``started`` until every actor answered a first call; then kill the actors and
    remove the placement group (not counted)."""
    ray.get([actor.ping.remote() for actor in actors], timeout=timeout_s)
    elapsed = time.perf_counter() - started
    for actor in actors:
        ray.kill(actor)
    remove_placement_group(pg)
    return elapsed
