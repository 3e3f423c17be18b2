"""Errors of the runtime layer: each one names what failed and where, so nobody reads Ray logs."""

from dataclasses import dataclass
from typing import Any


class ClusterError(RuntimeError):
    """The Ray cluster is not what the config asks for (too few nodes, a resource mismatch …)."""


FAILED = "failed"  # the method raised, the process died, its node was lost, no answer in time
STUCK = "stuck"  # alive, but no progress (no return, no heartbeat) for the call's stuck_after


@dataclass(frozen=True)
class RankFailure:
    """Why one rank of a group failed: its node, a one-line reason, the remote traceback (for a
    stuck rank: its Python stack at that moment) and the ``kind`` of failure. ``gone``: its
    process died, became unreachable or lost its node (not merely raised or stayed silent)."""

    rank: int
    node_rank: int | None
    reason: str
    traceback: str = ""
    kind: str = FAILED
    gone: bool = False
    pid: int | None = None  # of the process that failed, where Ray says it
    detail: str = ""  # what Ray said, verbatim, where the reason says it shorter (for the report)


class WorkerGroupError(RuntimeError):
    """Some ranks of a worker group failed, died or did not answer in time.

    ``failures`` maps rank → ``RankFailure``; ``results`` holds the values of the ranks that did
    finish (so a caller can still use or log them); ``pending`` lists ranks that had not answered
    when the error was raised.
    """

    def __init__(
        self,
        group: str,
        action: str,
        failures: dict[int, RankFailure],
        results: dict[int, Any] | None = None,
        pending: list[int] | None = None,
    ) -> None:
        self.group = group
        self.action = action
        self.failures = dict(sorted(failures.items()))
        self.results = dict(sorted((results or {}).items()))
        self.pending = sorted(pending or [])
        super().__init__(self._render())

    @property
    def failed_ranks(self) -> list[int]:
        return list(self.failures)

    @property
    def kind(self) -> str:
        """``stuck`` when every failed rank is alive but silent, else ``failed``."""
        return STUCK if all(failure.kind == STUCK for failure in self.failures.values()) else FAILED

    def _render(self) -> str:
        ranks = ", ".join(str(rank) for rank in self.failures)
        verb = "is stuck" if self.kind == STUCK else "failed"
        lines = [f"worker group {self.group!r}: {self.action} {verb} on rank(s) {ranks}"]
        for failure in list(self.failures.values())[:8]:
            where = f"node {failure.node_rank}" if failure.node_rank is not None else "unknown node"
            lines.append(f"  rank {failure.rank} ({where}): {failure.reason}")
            if failure.traceback:
                shown = failure.traceback.rstrip().splitlines()
                lines.extend("    " + line for line in (shown[:40] if failure.kind == STUCK else shown[-25:]))
        if len(self.failures) > 8:
            lines.append(f"  … and {len(self.failures) - 8} more failed ranks")
        if self.results:
            lines.append(f"  ranks that finished: {len(self.results)} (results kept on .results)")
        if self.pending:
            lines.append(f"  ranks still running: {len(self.pending)}")
        return "\n".join(lines)
