"""What a run returns (``RunResult``): how it ended, what it placed, what it wrote; the CLI prints
its ``report()``, tests and benchmarks read the rest."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlinfra.driver.metrics import METRICS_FILE, TENSORBOARD_DIR

if TYPE_CHECKING:
    from .job import Job

SUMMARY_FILE = "summary.json"
PLACEMENT_FILE = "placement.json"  # where the ranks run: nodes, pids, the logs folder
BUDGET, TARGET, INTERRUPTED, FAILED = "budget", "target", "interrupted", "failed"  # how a run ended
ENDED = "ended"  # resumed after it had ended so, with the same config: nothing was run


@dataclass
class RunResult:
    """What a run did; the CLI prints ``report()``, tests and benchmarks read the rest."""

    job: Job
    output_dir: Path
    resumed_from: int = 0  # the iteration the checkpoint was at; 0 for a fresh run
    outcome: str = BUDGET
    wall_s: float = 0.0  # this process: Ray start, launch, training and teardown
    time_to_target_s: float | None = None  # training seconds until the target was first reached
    iterations_to_target: int | None = None  # the iteration of that first crossing
    plot: Path | None = None
    placements: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    relations: dict[str, str] = field(default_factory=dict)  # "actor-rollout" → "colocated", …
    misplaced_bundles: list[str] = field(default_factory=list)  # expected: none
    switches: dict[str, float] = field(default_factory=dict)  # time-sharing, when colocated
    phases: list[tuple[str, str]] = field(default_factory=list)  # (component, sleep/wake) in order
    memory: dict[str, dict[str, Any]] = field(default_factory=dict)  # measured vs the memory plan
    ended_by: str = ""  # with outcome ENDED: how the resumed run had ended (budget, target)

    @property
    def state(self) -> Any:
        return self.job.state

    @property
    def iterations(self) -> int:
        return int(self.job.state.iteration)

    @property
    def interrupted(self) -> bool:
        return self.outcome == INTERRUPTED

    @property
    def batches(self) -> dict[str, Any]:
        """How every batch id of this run ended; none open, none duplicated."""
        return self.job.state.ledger.summary()

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` keeps."""
        state = self.job.state
        return {
            "outcome": self.outcome, "iterations": self.iterations, "interrupted": self.interrupted,
            "relations": self.relations, "target": self.job.target(),
            "time_to_target_s": self.time_to_target_s, "iterations_to_target": self.iterations_to_target,
            "training_s": round(state.training_s, 3), "wall_s": round(self.wall_s, 3),
            "batches": self.batches, "recoveries": state.events, "switches": self.switches,
            "memory": self.memory, "config": self.job.config.model_dump(mode="json"),
        } | self.job.outcome(self)  # fmt: skip

    def report(self) -> str:
        """The closing lines: how the run ended, the job's lines, the recoveries, the files."""
        job, folder, count = self.job, self.output_dir, self.iterations
        what, target, reached = job.target_key.replace("_", " "), job.target(), self.time_to_target_s
        head = f"{count} {job.unit}s"
        if self.outcome == ENDED:
            ended = f"the run already ended ({self.ended_by}) at {job.unit} {count} with this config"
            return f"nothing to resume: {ended}; change it (e.g. a larger budget) to go on; files: {folder}"
        if self.interrupted:
            head = f"interrupted after {job.unit} {count}; everything released; continue with --resume"
        elif reached is not None:  # the first crossing's own iteration and time, then the whole run's
            crossed = self.iterations_to_target
            head = f"reached {what} {target:g} at {job.unit} {crossed}, {reached:.1f} s of training"
            head += f"; {count} {job.unit}s in all" if count != crossed else ""
        elif target is not None:
            head = f"did NOT reach {what} {target:g} in {count} {job.unit}s"
        lines = [f"{head} ({self.wall_s:.1f} s wall, with Ray start and launch)", *job.report(self)]
        if state_events := job.state.events:
            lines.append(f"survived {len(state_events)} fault(s): see {folder / SUMMARY_FILE}")
        lines.append(f"metrics: {folder / METRICS_FILE}")
        if job.settings.tensorboard:
            lines.append(f"tensorboard: tensorboard --logdir {folder / TENSORBOARD_DIR}")
        if self.plot is not None:
            lines.append(f"curve: {self.plot}")
        if self.switches:
            switches, p50 = self.switches["switches"], self.switches["total_p50_s"]
            lines.append(f"time-sharing: {switches:.0f} switches, p50 {p50:.3f} s")
        return "\n".join(lines)
