"""What a job supplies to ``Run`` (``Job``), what a step gets back (``Batch``), what a run returns
(``RunResult``).

A job's target is the driver's too: ``Job.target_key`` names the record key it is set on and
``Job.target()`` its value, so ``Run`` stops there (``stop_at_target``), measures the training
time to it (from the metrics, across resumes), draws the curve and says how the run ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlinfra.driver.metrics import METRICS_FILE, TENSORBOARD_DIR
from rlinfra.services.weights import WeightSender

from .settings import RunSettings
from .state import RunState

if TYPE_CHECKING:
    from .run import Run

SUMMARY_FILE = "summary.json"
BUDGET, TARGET, INTERRUPTED, FAILED = "budget", "target", "interrupted", "failed"  # how a run ended


# What ``Run`` calls on each rank of the trainer group (``run.trainer``), besides the job's own
# methods; the version rule (above the version served, after a restart) is the run's.
TRAINER_METHODS = {
    "setup": "setup(checkpoint: bytes | None) -> int (build; restore checkpoint()'s bytes if given; "
    "return the weight version)",
    "checkpoint": "checkpoint() -> bytes (what setup restores)",
    "weights_state": "weights_state() -> {name: tensor} (the weights each version publishes)",
}


class TrainerContractError(TypeError):
    """A trainer class that lacks what ``Run`` calls on it, found before any process starts."""


def check_trainer(worker_cls: type, component: str) -> None:
    """``worker_cls`` keeps the trainer contract: a ``WeightSender`` with ``TRAINER_METHODS`` of
    its own (``weights_state`` not the base's placeholder); else a ``TrainerContractError``
    naming the class, the component and each thing it lacks."""
    missing = [] if issubclass(worker_cls, WeightSender) else ["WeightSender among its bases"]
    for name, what in TRAINER_METHODS.items():
        method = getattr(worker_cls, name, None)
        if not callable(method) or method is getattr(WeightSender, name, None):
            missing.append(what)
    if missing:
        raise TrainerContractError(
            f"{worker_cls.__name__}, the trainer ({component!r}), lacks: " + "; ".join(missing)
        )


class Job:
    """Set ``settings``, ``state`` and ``total`` (the iteration budget) in ``__init__``; override
    ``launch`` and ``step``, and whichever hook the job needs."""

    title = "RL"  # the progress bar's label, the curve's title
    components: tuple[str, ...] = ()  # what the YAML must place, in the order placement.json shows
    unit = "iteration"  # what the job calls one iteration, in messages
    target_key = ""  # the record key the target is set on ("": no target)
    stop_at_target = True
    settings: RunSettings
    state: RunState
    total: int

    def check(self, run: Run) -> None:
        """Refuse a shape the job cannot run (e.g. batches that do not split over the workers),
        once the layout is reserved and before any worker starts."""

    def launch(self, run: Run) -> None:
        """Start the groups (``run.launch``, ``run.start_trainer``, ``run.connect_weights``,
        ``run.supervise``)."""
        raise NotImplementedError

    def start(self, run: Run) -> None:
        """Begin: issue the first batches. Called again after a trainer restart (the state is
        rewound then; batches in flight were dropped)."""

    def step(self, run: Run) -> dict[str, Any]:
        """One iteration, ending with ``run.updated()``; returns its own metrics (the driver adds
        the iteration, versions and the weight barrier's times)."""
        raise NotImplementedError

    def target(self) -> float | None:
        """The value of ``target_key`` to reach (None: none, or not known yet)."""
        return None

    def curve(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The points of ``target_key`` over ``iteration`` and ``time_s`` (default: the records)."""
        return records

    def trainer_state(self, run: Run) -> bytes:
        """What a checkpoint keeps of the trainer (rank 0's ``checkpoint()``)."""
        return bytes(run.on_trainer(lambda: run.trainer.execute_on(0).checkpoint().wait()[0]))

    def line(self, record: dict[str, Any]) -> str | None:
        """A console line per iteration (None: none)."""
        return None

    def outcome(self, result: RunResult) -> dict[str, Any]:
        """The job's own entries of ``summary.json``."""
        return {}

    def report(self, result: RunResult) -> list[str]:
        """The job's own closing lines, under the driver's."""
        return []


@dataclass
class Batch:
    """One rank's result of a ``generate`` call, under the batch id it was made for."""

    rank: int
    id: str
    value: Any


@dataclass
class RunResult:
    """What a run did; the CLI prints ``report()``, tests and benchmarks read the rest."""

    job: Job
    output_dir: Path
    resumed_from: int = 0  # the iteration the checkpoint was at; 0 for a fresh run
    outcome: str = BUDGET
    wall_s: float = 0.0  # this process: Ray start, launch, training and teardown
    time_to_target_s: float | None = None  # training seconds until the target was first reached
    plot: Path | None = None
    placements: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    relations: dict[str, str] = field(default_factory=dict)  # "actor-rollout" → "colocated", …
    misplaced_bundles: list[str] = field(default_factory=list)  # expected: none
    switches: dict[str, float] = field(default_factory=dict)  # time-sharing, when colocated
    phases: list[tuple[str, str]] = field(default_factory=list)  # (component, sleep/wake) in order

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
            "outcome": self.outcome,
            "iterations": self.iterations,
            "interrupted": self.interrupted,
            "relations": self.relations,
            "target": self.job.target(),
            "time_to_target_s": self.time_to_target_s,
            "training_s": round(state.training_s, 3),
            "wall_s": round(self.wall_s, 3),
            "batches": self.batches,
            "recoveries": state.events,
            "switches": self.switches,
        } | self.job.outcome(self)

    def report(self) -> str:
        """The closing lines: how the run ended, the job's lines, the recoveries, the files."""
        job, folder, count = self.job, self.output_dir, self.iterations
        what, target, reached = job.target_key.replace("_", " "), job.target(), self.time_to_target_s
        head = f"{count} {job.unit}s"
        if self.interrupted:
            head = f"interrupted after {job.unit} {count}; everything released; continue with --resume"
        elif target is not None:
            got = f"reached {what} {target:g}" if reached is not None else f"did NOT reach {what} {target:g}"
            head = f"{got} in {count} {job.unit}s" + (f", {reached:.1f} s of training" if reached else "")
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
