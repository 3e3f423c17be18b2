"""Stuck is an error too: watching a group call's pending ranks for progress.

A rank proves progress by returning, or by a heartbeat from the method it runs
(``Worker.heartbeat()``). While a call waits, ranks that have done neither for the call's
``stuck_after`` seconds are stuck: the call fails with a ``WorkerGroupError`` of kind ``stuck``
naming each rank, its node, the method, how long it has been silent — and its Python stack at
that moment, so a hang reads like a traceback instead of hours of idle GPUs.

The watch costs nothing until ``stuck_after`` has passed (a fast call is never probed); then it
asks the pending ranks how long ago they beat (a method answered in the actor's own watch thread,
so a busy worker answers too) and sleeps until the earliest moment a rank could become stuck. A
worker that does not answer at all — a C call holding the GIL — is as silent as it has been
running. Detection therefore lands within about a probe (≤ ``PROBE_TIMEOUT_S``) of
``stuck_after``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlinfra.runtime.group import WorkerGroup

PROBE_TIMEOUT_S = 1.0  # the workers' answers to "when did you last beat?"
MIN_RECHECK_S = 0.2  # between two probes of a call whose ranks keep beating


class StuckWatch:
    """The progress watch of one call, started when the call was issued."""

    def __init__(self, group: WorkerGroup, stuck_after: float, started: float) -> None:
        self.group = group
        self.stuck_after = stuck_after
        self.started = started
        self._next_check = started + stuck_after

    def due_in(self) -> float:
        """Seconds until the next probe is worth making."""
        return max(0.0, self._next_check - time.monotonic())

    def silent_ranks(self, pending: Sequence[int]) -> dict[int, tuple[float, float | None]]:
        """The pending ranks silent for ``stuck_after`` or more: rank → (seconds silent, seconds
        since its last heartbeat or None). Schedules the next probe."""
        elapsed = time.monotonic() - self.started
        ages = self.group.probe_heartbeats(pending, PROBE_TIMEOUT_S)
        stuck: dict[int, tuple[float, float | None]] = {}
        soonest = self.stuck_after
        for rank in pending:
            age = ages.get(rank)
            age = age if isinstance(age, float) else None  # a failed probe: as silent as no answer
            silent = elapsed if age is None else min(elapsed, age)
            if silent >= self.stuck_after:
                stuck[rank] = (silent, age)
            else:
                soonest = min(soonest, self.stuck_after - silent)
        self._next_check = time.monotonic() + max(MIN_RECHECK_S, soonest)
        return stuck

    def reason(self, action: str, silent: float, age: float | None) -> str:
        beat = (
            "no heartbeat since it began"
            if age is None or age > silent
            else f"last heartbeat {age:.1f} s ago"
        )
        return (
            f"stuck in {action}: no progress for {silent:.1f} s (stuck_after {self.stuck_after:g} s; "
            f"{beat}); it is still running — its stack:"
        )
