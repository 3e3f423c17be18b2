"""The report a run leaves when it cannot go on: what failed, where and when, what was tried, what
is safe (the last committed weight version and checkpoint) and how to resume.

``FailureReport.of_run(error, ...)`` reads the failed ranks out of any of rlinfra's errors (a group
call's ``WorkerGroupError``, a ``WeightSyncError`` around one, a ``SupervisionError`` that refused
a replacement, an ``UnsupervisedLoss``), keeps the JSON in the output folder beside the metrics
and checkpoints, and attaches ``render()`` to the error as the note the CLI prints under it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlinfra.driver.checkpoints import CheckpointStore
from rlinfra.driver.supervisor import UnsupervisedLoss
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.supervision import Restart, SupervisionError
from rlinfra.services.weights import WeightSyncError

REPORT_FILE = "failure.json"


@dataclass(frozen=True)
class FailedRank:
    component: str
    rank: int
    node_rank: int | None
    reason: str
    kind: str = "failed"  # or "stuck", "lost", "unreplaceable"
    detail: str = ""  # what Ray said, verbatim, where the reason says it shorter (a death's cause)


def failed_ranks(error: BaseException) -> list[FailedRank]:
    """The ranks ``error`` (or the error it wraps) names, most specific first."""
    if isinstance(error, SupervisionError):
        return [FailedRank(error.component, error.rank, error.node_rank, str(error), "unreplaceable")]
    if isinstance(error, UnsupervisedLoss):
        return [FailedRank(g, r, None, "lost", "lost") for g, ranks in error.gone.items() for r in ranks]
    if isinstance(error, WeightSyncError):
        return failed_ranks(error.cause)
    if isinstance(error, WorkerGroupError):
        failures = error.failures.values()
        return [FailedRank(error.group, f.rank, f.node_rank, f.reason, f.kind, f.detail) for f in failures]
    cause = error.__cause__
    return failed_ranks(cause) if cause is not None else []


@dataclass
class FailureReport:
    """Everything needed to understand a stopped run and to continue it."""

    error: str  # the error's type and first line
    at: float  # Unix time the run gave up
    failed: list[FailedRank] = field(default_factory=list)
    attempts: list[Restart] = field(default_factory=list)  # replacements and restarts, in order
    committed_version: int | None = None  # the weight version every rollout worker serves
    checkpoint: dict[str, Any] | None = None  # {"iteration": …, "path": …} of the last one saved
    resume: str = "the same command, without --resume (no checkpoint was written)"  # or with it, from one
    details: dict[str, Any] = field(default_factory=dict)  # e.g. the batch ledger's counts

    @classmethod
    def of_run(
        cls, error: BaseException, output: Path, attempts: list[Restart], version: int | None, batches: Any
    ) -> FailureReport:
        """The report of a launched run that failed, written as ``failure.json`` in ``output``
        and attached to ``error`` as a note. ``attempts``: every replacement and trainer restart;
        ``version``: the committed weight version; ``batches``: the ledger's counts. The run keeps
        its checkpoints in ``output`` (a ``CheckpointStore``) and resumes with ``--resume``."""
        saved, headline = CheckpointStore(output).load_latest(), str(error).partition("\n")[0]
        attempts = sorted(attempts, key=lambda attempt: attempt.at)
        report = cls(
            f"{type(error).__name__}: {headline}", time.time(), failed_ranks(error), attempts, version
        )
        report.details["batches"] = batches
        if saved is not None:
            report.checkpoint = {"iteration": saved.step, "path": str(saved.path)}
            report.resume = f"the same command with --resume (continues from {saved.path})"
        # beside the metrics the run made
        (output / REPORT_FILE).write_text(json.dumps(asdict(report), indent=1, default=str), encoding="utf-8")
        # ``error.add_note`` from Python 3.11 on: the same list of notes, which 3.10 lacks
        error.__notes__ = [*getattr(error, "__notes__", []), report.render()]  # type: ignore[attr-defined]
        return report

    def render(self) -> str:
        """The report as lines for a terminal."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.at))
        kind, _, headline = self.error.partition(": ")  # the error, printed just above the report
        lines = [f"the run stopped at {when} ({kind})"]
        for rank in self.failed:
            where = f"node {rank.node_rank}" if rank.node_rank is not None else "unknown node"
            reason = rank.reason.partition("\n")[0]
            if reason != headline:  # each fact once
                lines.append(f"  {rank.component}:{rank.rank} ({where}) {rank.kind}: {reason}")
        lines.append(f"what was tried: {len(self.attempts) or 'nothing'}")
        for attempt in self.attempts:
            stamp = time.strftime("%H:%M:%S", time.localtime(attempt.at))
            said = attempt.detail.partition("\n")[0]
            detail = f" ({said})" if said and said != headline else ""
            who = f"{attempt.component}:{attempt.rank}"
            lines.append(f"  {stamp} {who} {attempt.outcome} in {attempt.took_s:.1f} s{detail}")
        if self.committed_version is not None:
            lines.append(f"last committed weight version: {self.committed_version}")
        saved = self.checkpoint
        last = f"iteration {saved['iteration']} at {saved['path']}" if saved is not None else "none"
        lines.extend([f"last checkpoint: {last}", f"to resume: {self.resume}"])
        return "\n".join(lines)
