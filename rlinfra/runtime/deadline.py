"""One way to wait: every wait in rlinfra is bounded by a ``Deadline``, and a condition that has
no event to wait on is polled by ``poll``.

A leaf module (no Ray, no other rlinfra module), so that the placement-free services and the
worker side use it too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Deadline:
    """When a wait must end (``time.monotonic()``), and the seconds it was given (for messages).
    ``Deadline.after(None)`` never ends: for the waits a user asked to be unbounded."""

    at: float
    limit_s: float

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        return cls(math.inf, math.inf) if seconds is None else cls(time.monotonic() + seconds, seconds)

    def left(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def sooner(self, seconds: float) -> Deadline:
        """This deadline, or ``seconds`` from now if that comes first."""
        return Deadline(min(self.at, time.monotonic() + seconds), self.limit_s)


def poll(
    check: Callable[[], T | None],
    deadline: Deadline,
    timed_out: Callable[[], Exception],
    every_s: float = 0.2,
) -> T:
    """``check()`` until it returns something other than None, which is returned; at the
    deadline, raise ``timed_out()`` (the caller's error, saying what was waited for)."""
    while True:
        found = check()
        if found is not None:
            return found
        if deadline.expired:
            raise timed_out()
        time.sleep(min(every_s, deadline.left()))
