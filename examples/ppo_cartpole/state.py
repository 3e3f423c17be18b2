"""The driver's state, the one place its counters live, and the run's result, which reads them.

``DriverState`` is what the driver loop changes as it goes: progress (kept across a resume through
the checkpoint) and this process's record of which weight versions were trained on and served.
The current weight version is not here: the ``WeightSync`` counts it. ``JobResult`` holds the
state and adds how the run ended; its counters are properties of the state, never copies.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from examples.ppo_cartpole.config import JobConfig
from rlinfra.runtime.supervision import Restart
from rlinfra.services.batches import BatchLedger
from rlinfra.services.supervisor import Recovery

CHECKPOINTED = ("iteration", "env_steps", "training_s", "time_to_target_s", "returns")


@dataclass
class DriverState:
    """What the driver carries across iterations; the ``CHECKPOINTED`` fields also across a resume."""

    returns: collections.deque[float]  # the last ``return_window`` episode returns
    iteration: int = 0  # counted across resumes
    env_steps: int = 0
    training_s: float = 0.0  # from the first rollout to the last update, across resumes
    time_to_target_s: float | None = None
    first_mean_return: float = math.nan  # after this process's first iteration
    batch_versions: list[list[int]] = field(default_factory=list)  # per iteration, per env worker
    served_versions: list[int] = field(default_factory=list)  # the rollout workers', after each sync
    dropped_batches: int = 0
    ledger: BatchLedger = field(default_factory=BatchLedger)  # every batch id and how it ended
    recoveries: list[Recovery] = field(default_factory=list)  # dead workers replaced mid-run
    trainer_restarts: list[Restart] = field(default_factory=list)  # the trainer, from its checkpoint

    @classmethod
    def restore(cls, saved: Mapping[str, Any] | None, window: int) -> DriverState:
        """A fresh state, or the one ``checkpointed()`` saved."""
        saved = dict(saved or {})
        returns = collections.deque(saved.pop("returns", []), maxlen=window)
        return cls(returns=returns, **saved)

    def rewind(self, saved: Mapping[str, Any] | None) -> None:
        """Back to the checkpoint ``checkpointed()`` saved (or to the start), after a trainer
        restart; ``training_s`` keeps counting the time actually spent."""
        saved = dict(saved or {})
        self.iteration = int(saved.get("iteration", 0))
        self.env_steps = int(saved.get("env_steps", 0))
        self.time_to_target_s = saved.get("time_to_target_s")
        self.returns.clear()
        self.returns.extend(saved.get("returns", []))
        del self.batch_versions[self.iteration :]

    @property
    def mean_return(self) -> float:
        return sum(self.returns) / len(self.returns) if self.returns else math.nan

    def checkpointed(self) -> dict[str, Any]:
        """The fields a resumed run continues from, as plain values."""
        saved = {name: getattr(self, name) for name in CHECKPOINTED}
        saved["returns"] = list(self.returns)
        return saved


@dataclass
class JobResult:
    """What a run did; the CLI prints it and the tests check it."""

    job: JobConfig  # what it ran with
    state: DriverState
    output_dir: Path
    resumed_from: int  # the iteration the checkpoint was at, 0 for a fresh run
    solved: bool = False
    interrupted: bool = False
    wall_s: float = 0.0  # this process: Ray start, launch, training and teardown
    plot: Path | None = None
    placements: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    misplaced_bundles: list[str] = field(default_factory=list)

    @property
    def iterations(self) -> int:
        return self.state.iteration

    @property
    def env_steps(self) -> int:
        return self.state.env_steps

    @property
    def mean_return(self) -> float:
        return self.state.mean_return

    @property
    def first_mean_return(self) -> float:
        return self.state.first_mean_return

    @property
    def batch_versions(self) -> list[list[int]]:
        return self.state.batch_versions

    @property
    def served_versions(self) -> list[int]:
        return self.state.served_versions

    @property
    def dropped_batches(self) -> int:
        return self.state.dropped_batches

    @property
    def batches(self) -> dict[str, Any]:
        """How every batch id of this run ended (trained, dropped, lost) and none duplicated."""
        return self.state.ledger.summary()

    @property
    def steps_per_s(self) -> float:
        state = self.state
        return state.env_steps / state.training_s if state.training_s > 0 else 0.0
