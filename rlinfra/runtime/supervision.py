"""Supervision: what a worker group records and refuses when its dead workers are replaced.

``WorkerGroup.replace(rank)`` relaunches a dead rank into its own reserved bundle (same rank,
node and devices). Each replacement is charged to the component's ``RestartBudget`` (its YAML
``restart: {max, within_s}``, ``rlinfra.placement.restart``) and recorded as a ``Restart``, which
is what a run's failure report lists under "what was tried". Two things end supervision with an
error instead of a replacement: the budget is spent (``RestartBudgetExhausted``), or the rank's
node is gone (``UnreplaceableError``: its bundle cannot come back anywhere else without changing
the rank's devices).
"""

import collections
import time
from dataclasses import dataclass

from rlinfra.placement.restart import DEFAULT_RESTART, RestartPolicy

REPLACED = "replaced"
RESTARTED = "restarted"  # a whole group brought back from a checkpoint (a data-parallel trainer)
REFUSED = "refused"
FAILED = "failed"


class SupervisionError(RuntimeError):
    """A dead worker could not be replaced; ``component``, ``rank`` and ``node_rank`` say which."""

    def __init__(self, component: str, rank: int, node_rank: int | None, message: str) -> None:
        self.component, self.rank, self.node_rank = component, rank, node_rank
        where = f"node {node_rank}" if node_rank is not None else "unknown node"
        super().__init__(f"{component}:{rank} ({where}): {message}")


class RestartBudgetExhausted(SupervisionError):
    """The component's ``restart`` budget is spent: its workers keep dying."""


class UnreplaceableError(SupervisionError):
    """The rank's node is gone, so its bundle (and devices) cannot be had again."""


@dataclass(frozen=True)
class Restart:
    """One replacement attempt: which rank, why, when (Unix time), how long it took, how it ended."""

    component: str
    rank: int
    node_rank: int | None
    reason: str
    at: float
    took_s: float
    outcome: str  # REPLACED, RESTARTED, REFUSED (budget or node) or FAILED (the new one did not come up)
    detail: str = ""


class RestartBudget:
    """``policy.max_restarts`` replacements within any ``policy.within_s`` seconds."""

    def __init__(self, policy: RestartPolicy | None) -> None:
        self.policy = policy or DEFAULT_RESTART
        self._charged: collections.deque[float] = collections.deque()

    def charge(self, component: str, rank: int, node_rank: int | None) -> None:
        """Count one replacement, or raise ``RestartBudgetExhausted`` if that would exceed the budget."""
        now = time.monotonic()
        while self._charged and now - self._charged[0] > self.policy.within_s:
            self._charged.popleft()  # charged before the window
        if len(self._charged) >= self.policy.max_restarts:
            policy = self.policy
            spent = (
                f"restart budget spent: {policy.max_restarts} replacement(s) within {policy.within_s:g} s "
                "(the component's restart setting in cluster.component_placement)"
            )
            raise RestartBudgetExhausted(component, rank, node_rank, spent)
        self._charged.append(now)
