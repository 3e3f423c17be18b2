"""The gate generation passes through on a receiver, which an update closes around its swap.

The gate is a lock with an owner and a lease: a driver that dies while the workers are paused
cannot leave them paused for ever — the pause ends on its own when the lease runs out. Closing it
waits, with a deadline, for the generation already inside to drain. Its lock also guards the
receiver's buffers, so that what generation reads and whether the gate is open change together.
"""

import threading
import time

from rlinfra.runtime.deadline import Deadline


class WeightsPausedError(TimeoutError):
    """Generation waited longer than its deadline for a paused update to finish."""


class WeightsPauseError(RuntimeError):
    """The gate could not be closed: another update holds it, or generation did not drain in time."""


class Gate:
    """Open, or closed by one owner until it reopens it or its lease runs out. Every method expects
    ``lock`` held: the receiver holds it around its buffers too (``DoubleBuffers``)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.paused_by: str | None = None
        self.pause_until = 0.0
        self.closed_at = 0.0  # when the gate last closed (time.monotonic)
        self.in_flight = 0

    def enter(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) while the gate is closed, then count one call inside."""
        deadline = Deadline.after(timeout_s)
        while self.paused_by is not None:
            if time.monotonic() >= self.pause_until:  # the owner's lease ran out: reopen the gate
                self.paused_by = None
                self.lock.notify_all()
                break
            if deadline.expired:
                raise WeightsPausedError(
                    f"generation waited {timeout_s:g} s for a weight update ({self.paused_by}) to finish"
                )
            self.lock.wait(deadline.sooner(self.pause_until - time.monotonic()).left())
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1
        self.lock.notify_all()

    def close(self, owner: str, lease_s: float, drain_timeout_s: float) -> None:
        """Close the gate for ``owner`` (until it reopens it, at most ``lease_s``) and wait for the
        calls inside to drain."""
        if self.paused_by is not None and time.monotonic() < self.pause_until:
            raise WeightsPauseError(f"already paused by {self.paused_by}")
        self.closed_at = time.monotonic()
        self.paused_by, self.pause_until = owner, self.closed_at + lease_s
        if not self.lock.wait_for(lambda: not self.in_flight, drain_timeout_s):
            raise WeightsPauseError(
                f"{self.in_flight} generation call(s) still running after {drain_timeout_s:g} s"
            )

    def open(self, owner: str) -> float:
        """Reopen the gate (only its owner may); how long it was closed, or 0 if not by ``owner``."""
        if self.paused_by != owner:
            return 0.0
        self.paused_by = None
        self.lock.notify_all()
        return time.monotonic() - self.closed_at
